package faults

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// TestProxyModes: a proxy passes bytes both ways; blackholed it holds
// them on open connections and lets them through when passed again;
// delayed, they arrive no sooner than the delay; dropped, its
// connections end and new ones are reset.
func TestProxyModes(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	p, err := NewProxy(echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string, wait time.Duration) (string, error) {
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			return "", err
		}
		c.SetReadDeadline(time.Now().Add(wait))
		return r.ReadString('\n')
	}
	if got, err := roundTrip("pass", 5*time.Second); err != nil || got != "pass\n" {
		t.Fatalf("pass: %q %v", got, err)
	}
	p.Set(Blackhole, 0)
	if got, err := roundTrip("held", 200*time.Millisecond); err == nil {
		t.Fatalf("blackholed, %q came back", got)
	}
	p.Set(Pass, 0)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("the held bytes after the blackhole: %q %v", got, err)
	}
	p.Set(Delay, 150*time.Millisecond)
	start := time.Now()
	if got, err := roundTrip("slow", 5*time.Second); err != nil || got != "slow\n" || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("delayed: %q %v after %s", got, err, time.Since(start))
	}
	p.Set(Drop, 0)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("a dropped connection still reads")
	}
	d, err := net.Dial("tcp", p.Addr())
	if err == nil {
		d.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := d.Read(make([]byte, 1)); err == nil {
			t.Fatal("a new connection through a dropping proxy stayed open")
		}
		d.Close()
	}
}
