//go:build !unix

package lease

import (
	"context"
	"errors"
	"time"
)

// ErrDataDirLocked: another process holds the embedded member's data
// directory.
var ErrDataDirLocked = errors.New("lease: the embedded etcd data directory is in use by another process")

// dirLock is a no-op where flock(2) does not exist: etcd's own database
// lock is all there is.
type dirLock struct{}

func lockDir(context.Context, string, time.Duration) (*dirLock, error) { return &dirLock{}, nil }

func (*dirLock) unlock() {}
