//go:build unix

package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrDataDirLocked: another process holds the embedded member's data
// directory. Two members on one directory would corrupt it; etcd itself
// would wait for the database lock forever.
var ErrDataDirLocked = errors.New("lease: the embedded etcd data directory is in use by another process")

// lockFile is the file in the data directory an embedded member holds an
// exclusive lock on while it runs; it holds the owner's process id.
const lockFile = "fcd.lock"

// dirLock is a held lock on a data directory.
type dirLock struct{ f *os.File }

// lockDir takes the exclusive lock of dir, waiting up to timeout (and no
// longer than ctx) for a process that holds it to let go.
func lockDir(ctx context.Context, dir string, timeout time.Duration) (*dirLock, error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lease: lock file: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lease: lock %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			owner, _ := os.ReadFile(path)
			f.Close()
			pid := strings.TrimSpace(string(owner))
			if pid == "" {
				pid = "unknown"
			}
			return nil, fmt.Errorf("%w: %s is locked by process %s (waited %s); stop that process, or give this one another data directory",
				ErrDataDirLocked, dir, pid, timeout)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dirLock{f: f}, nil
}

// unlock releases the lock (closing the file releases it).
func (l *dirLock) unlock() {
	if l != nil && l.f != nil {
		l.f.Close()
	}
}
