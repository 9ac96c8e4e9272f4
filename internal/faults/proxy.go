// Package faults injects network faults between fcd and etcd for the
// robustness suite (faults_test.go): a loopback TCP proxy per member that
// passes traffic, delays it, or blackholes it — connections stay open and
// nothing goes through, as behind a partition.
package faults

import (
	"net"
	"sync"
	"time"
)

// Mode is what a Proxy does to the traffic through it.
type Mode int

// Modes of a Proxy.
const (
	// Pass forwards traffic as it comes.
	Pass Mode = iota
	// Blackhole keeps every connection open and forwards nothing, either
	// way, until the mode changes: a partition that the peers cannot see.
	Blackhole
	// Delay forwards each chunk after the proxy's delay.
	Delay
	// Drop resets every connection and every new one at once, as a
	// member that went away (or a firewall that rejects) does.
	Drop
)

// Proxy is a TCP proxy from a loopback address to one target.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	closed bool
	mode   Mode
	delay  time.Duration
	wake   chan struct{} // closed when the mode changes
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, wake: make(chan struct{}), conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address to dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Set changes the mode (and, for Delay, the delay).
func (p *Proxy) Set(m Mode, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode, p.delay = m, delay
	close(p.wake)
	p.wake = make(chan struct{})
	if m == Drop {
		for c := range p.conns {
			c.Close()
		}
	}
}

// Close stops the proxy and its connections.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	close(p.wake)
	p.wake = make(chan struct{})
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		drop := p.mode == Drop
		p.mu.Unlock()
		if drop {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // a reset, not an orderly close
			}
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[u] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(u, c)
		go p.pipe(c, u)
	}
}

// pipe copies src to dst as the mode allows, until either closes.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.forward(dst, buf[:n]) {
			return
		}
		if err != nil { // io.EOF or a closed connection: either ends the pipe
			return
		}
	}
}

// forward writes b to dst once the mode lets it through; false when the
// proxy closed or the write failed.
func (p *Proxy) forward(dst net.Conn, b []byte) bool {
	for {
		p.mu.Lock()
		mode, delay, wake, closed := p.mode, p.delay, p.wake, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		switch mode {
		case Drop:
			return false
		case Blackhole:
			<-wake // hold the bytes until the mode changes
			continue
		case Delay:
			time.Sleep(delay)
		}
		_, err := dst.Write(b)
		return err == nil
	}
}
