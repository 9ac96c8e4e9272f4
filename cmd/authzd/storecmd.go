package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fcd-authz/fcd/internal/cli"
	"github.com/fcd-authz/fcd/lease"
)

// disarmMargin is the share of the quota that must be free before `store
// alarm disarm` disarms NOSPACE: etcd checks the database file's size
// against the quota on every write, so with less free the first writes
// raise the alarm again at once.
const disarmMargin = 0.1

// storeCommand runs `authzd store status | snapshot save FILE | snapshot
// restore FILE | compact [REV] | defrag | alarm list | alarm disarm`: the
// store's maintenance without etcdctl, through fcd's own connection to
// etcd (serve's flags and --config file say where and with which
// credentials; see Config.storeConfig).
func storeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: store needs status, snapshot save|restore, compact, defrag or alarm list|disarm", cli.ErrUsage)
	}
	name, rest := args[0], args[1:]
	if name == "snapshot" || name == "alarm" {
		if len(rest) == 0 {
			return fmt.Errorf("%w: store %s needs a subcommand", cli.ErrUsage, name)
		}
		name, rest = name+" "+rest[0], rest[1:]
	}
	var force bool
	var bump uint64
	more := func(fs *flag.FlagSet) {}
	switch name {
	case "status", "compact", "defrag", "alarm list", "snapshot save":
	case "snapshot restore":
		more = func(fs *flag.FlagSet) {
			fs.BoolVar(&force, "force", false, "replace an etcd directory that holds data (it is kept aside as DIR.before-restore-TIME)")
			fs.Uint64Var(&bump, "bump-revision", lease.DefaultRevisionBump, "how far above the snapshot's revision the restored store starts: more than the revisions written since the snapshot")
		}
	case "alarm disarm":
		more = func(fs *flag.FlagSet) {
			fs.BoolVar(&force, "force", false, "disarm NOSPACE even though the database still fills the quota (the next writes raise it again)")
		}
	default:
		return fmt.Errorf("%w: unknown store command %q", cli.ErrUsage, name)
	}
	cfg, arg, err := parseConnectionFlags("store "+name, rest, more)
	if err != nil {
		return err
	}
	switch name {
	case "snapshot save", "snapshot restore":
		if arg == "" {
			return fmt.Errorf("%w: store %s needs FILE", cli.ErrUsage, name)
		}
	case "compact":
	default:
		if arg != "" {
			return fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, arg)
		}
	}
	if len(cfg.EtcdEndpoints) == 0 && cfg.DataDir == "" {
		return fmt.Errorf("%w: --data-dir or --etcd-endpoints is required", cli.ErrUsage)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if name == "snapshot restore" {
		return storeRestore(ctx, &cfg, arg, force, bump, stdout)
	}
	store, done, err := openCommandStore(ctx, &cfg, log, stderr)
	if err != nil {
		return err
	}
	defer done()
	switch name {
	case "status":
		st, err := store.Status(ctx)
		if err != nil {
			return err
		}
		return printJSON(stdout, st)
	case "snapshot save":
		return storeSnapshotSave(ctx, store, arg, stdout)
	case "compact":
		var rev int64
		if arg != "" {
			if rev, err = strconv.ParseInt(arg, 10, 64); err != nil || rev <= 0 {
				return fmt.Errorf("%w: compact REV: %q is not a positive revision", cli.ErrUsage, arg)
			}
		}
		at, err := store.Compact(ctx, rev)
		if err != nil {
			return err
		}
		return printJSON(stdout, map[string]int64{"compactedAt": at})
	case "defrag":
		res, err := store.Defrag(ctx)
		if perr := printJSON(stdout, res); err == nil {
			err = perr
		}
		return err
	case "alarm list":
		alarms, err := store.Alarms(ctx)
		if err != nil {
			return err
		}
		return printJSON(stdout, alarms)
	case "alarm disarm":
		if !force {
			if err := disarmable(ctx, store); err != nil {
				return err
			}
		}
		disarmed, err := store.DisarmAlarms(ctx)
		if err != nil {
			return err
		}
		return printJSON(stdout, map[string]any{"disarmed": disarmed})
	}
	return nil
}

// openCommandStore opens the store for one command. An external cluster
// is reached as serve reaches it. The embedded member of --data-dir is
// reached through the authzd that runs it, when one holds the directory;
// when none does, the command starts the member itself for its duration
// (done stops it), so that an operator can inspect and repair a store
// whose authzd is stopped.
func openCommandStore(ctx context.Context, cfg *Config, log *slog.Logger, stderr io.Writer) (_ *lease.Store, done func(), err error) {
	var member *lease.Embedded
	if len(cfg.EtcdEndpoints) == 0 {
		if _, err := os.Stat(filepath.Join(cfg.etcdDir(), "member")); err != nil {
			return nil, nil, fmt.Errorf("no embedded etcd data in %s (is --data-dir right?): %w", cfg.etcdDir(), err)
		}
		ec := cfg.embedConfig()
		ec.LockTimeout = 100 * time.Millisecond // held: authzd runs on it
		switch m, err := lease.StartEmbedded(ctx, ec); {
		case errors.Is(err, lease.ErrDataDirLocked):
			// authzd runs the member: go through its endpoint.
		case err != nil:
			return nil, nil, err
		default:
			member = m
			fmt.Fprintf(stderr, "authzd: no authzd runs on %s; started its embedded etcd member for this command\n", cfg.etcdDir())
		}
	}
	closeMember := func() {
		if member != nil {
			member.Close()
		}
	}
	sc, err := cfg.storeConfig(member, log)
	if err != nil {
		closeMember()
		return nil, nil, err
	}
	store, err := lease.Open(ctx, sc)
	if err != nil {
		closeMember()
		return nil, nil, err
	}
	return store, func() {
		if err := store.Close(); err != nil {
			log.Warn("close store", "err", err)
		}
		closeMember()
	}, nil
}

// storeSnapshotSave writes a snapshot to file, whole or not at all: to a
// temporary file beside it, synced, then renamed.
func storeSnapshotSave(ctx context.Context, store *lease.Store, file string, stdout io.Writer) error {
	tmp := file + ".part"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	info, err := store.SnapshotSave(ctx, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, file)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("snapshot %s: %w", file, err)
	}
	// Read back as a restore will read it.
	content, err := lease.InspectSnapshot(file)
	if err != nil {
		return err
	}
	return printJSON(stdout, struct {
		File string `json:"file"`
		lease.SnapshotInfo
		lease.SnapshotFile
	}{file, info, content})
}

// storeRestore restores the embedded member's directory from a snapshot
// (lease.RestoreEmbedded): authzd must be stopped.
func storeRestore(ctx context.Context, cfg *Config, file string, force bool, bump uint64, stdout io.Writer) error {
	if len(cfg.EtcdEndpoints) > 0 {
		return fmt.Errorf("%w: store snapshot restore restores the embedded member of --data-dir; an external cluster is restored member by member with etcdutl (docs/operations.md)", cli.ErrUsage)
	}
	if bump == 0 {
		return fmt.Errorf("%w: --bump-revision must be positive: revisions after the restore must be higher than any seen before", cli.ErrUsage)
	}
	res, err := lease.RestoreEmbedded(ctx, lease.RestoreConfig{Dir: cfg.etcdDir(), Snapshot: file, Force: force, RevisionBump: bump,
		ClientURL: cfg.EmbeddedEtcdClientURL, PeerURL: cfg.EmbeddedEtcdPeerURL})
	switch {
	case errors.Is(err, lease.ErrDataDirLocked):
		return fmt.Errorf("%w: stop authzd before restoring its store", err)
	case errors.Is(err, lease.ErrRestoreTargetExists):
		return fmt.Errorf("%w (--force)", err)
	case err != nil:
		return err
	}
	return printJSON(stdout, struct {
		Dir string `json:"dir"`
		lease.RestoreResult
	}{cfg.etcdDir(), res})
}

// disarmable refuses to disarm NOSPACE while a member's database still
// fills its quota but for less than disarmMargin: the alarm would be raised
// again by the next writes. It says what to do first.
func disarmable(ctx context.Context, store *lease.Store) error {
	st, err := store.Status(ctx)
	if err != nil {
		return err
	}
	full := false
	for _, a := range st.Alarms {
		full = full || a.Alarm == lease.AlarmNoSpace
	}
	if !full {
		return nil
	}
	for _, m := range st.Members {
		if m.Quota > 0 && float64(m.DBSize) > (1-disarmMargin)*float64(m.Quota) {
			return fmt.Errorf("%s: the database file is %d bytes of a %d-byte quota: disarming now raises NOSPACE again at the next writes; "+
				"run authzd store compact, then authzd store defrag, first (if it stays full, what is live fills it: stop what filled it, "+
				"or restart with a larger --etcd-quota), or disarm anyway with --force", m.Endpoint, m.DBSize, m.Quota)
		}
	}
	return nil
}
