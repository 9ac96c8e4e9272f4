// Command etcdmember runs one etcd member in its own process, built from
// the etcd server this module links (go.etcd.io/etcd/server/v3/embed) and
// nothing of fcd: the external etcd of the lease conformance suite (see
// etcdtest.StartProcess). Its flags are the subset of etcd's own that a
// single member on loopback needs.
//
// It stops on SIGINT or SIGTERM and, with -exit-with-stdin, when its
// standard input reaches end of file: a test that starts it with a pipe on
// stdin leaves no member behind even if the test process dies.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "etcdmember:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := embed.NewConfig()
	var listenClient, advertiseClient, listenPeer, advertisePeer, logOutputs string
	flag.StringVar(&cfg.Name, "name", "default", "member name")
	flag.StringVar(&cfg.Dir, "data-dir", "", "data directory (required)")
	flag.StringVar(&listenClient, "listen-client-urls", "http://127.0.0.1:2379", "client URLs to listen on")
	flag.StringVar(&advertiseClient, "advertise-client-urls", "", "client URLs to advertise (default: the listen URLs)")
	flag.StringVar(&listenPeer, "listen-peer-urls", "http://127.0.0.1:2380", "peer URLs to listen on")
	flag.StringVar(&advertisePeer, "initial-advertise-peer-urls", "", "peer URLs to advertise (default: the listen URLs)")
	flag.StringVar(&cfg.InitialCluster, "initial-cluster", "", "name=peerURL,... (default: this member alone)")
	flag.StringVar(&cfg.LogLevel, "log-level", "warn", "log level")
	flag.StringVar(&logOutputs, "log-outputs", "stderr", "comma-separated log outputs")
	exitWithStdin := flag.Bool("exit-with-stdin", false, "stop when standard input reaches end of file")
	startTimeout := flag.Duration("start-timeout", time.Minute, "how long to wait for the member to be ready")
	flag.Parse()
	if cfg.Dir == "" {
		return errors.New("-data-dir is required")
	}
	var err error
	if cfg.ListenClientUrls, err = urls(listenClient); err != nil {
		return err
	}
	if cfg.AdvertiseClientUrls, err = urls(or(advertiseClient, listenClient)); err != nil {
		return err
	}
	if cfg.ListenPeerUrls, err = urls(listenPeer); err != nil {
		return err
	}
	if cfg.AdvertisePeerUrls, err = urls(or(advertisePeer, listenPeer)); err != nil {
		return err
	}
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	}
	cfg.LogOutputs = strings.Split(logOutputs, ",")

	stdinClosed := make(chan struct{})
	if *exitWithStdin {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			close(stdinClosed)
		}()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("member failed: %w", err)
	case <-time.After(*startTimeout):
		return fmt.Errorf("not ready after %s", *startTimeout)
	case <-stdinClosed:
		return nil
	case <-sig:
		return nil
	}
	fmt.Fprintln(os.Stderr, "etcdmember: ready, serving clients on", listenClient)

	select {
	case err := <-e.Err():
		return fmt.Errorf("member failed: %w", err)
	case <-stdinClosed:
	case <-sig:
	}
	return nil
}

func urls(s string) ([]url.URL, error) {
	var out []url.URL
	for _, part := range strings.Split(s, ",") {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("url %q: %w", part, err)
		}
		out = append(out, *u)
	}
	return out, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
