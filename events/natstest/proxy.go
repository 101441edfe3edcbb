package natstest

import (
	"io"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy that cuts every connection through it at once and
// refuses new ones until healed, as a network partition would: a cluster's
// routes (Isolate) and a worker's connection to its NATS server go through
// one.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   []net.Conn
	down    bool
	cuts    int
	refused int
}

// NewProxy listens on a free loopback port and forwards each connection
// to target until Close.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target}
	go p.serve()
	return p, nil
}

// Addr is where p listens.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.isDown() {
			_ = in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		if p.down {
			p.refused++
			p.mu.Unlock()
			_ = in.Close()
			_ = out.Close()
			continue
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
		go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
	}
}

// isDown reports whether p is cut, counting a connection refused for it.
func (p *Proxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		p.refused++
	}
	return p.down
}

// Cut closes every connection through p and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	p.cuts++
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Heal lets connections through p again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Close stops listening and cuts every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Cut()
}

// Stats are the connections open through p (each direction's end counts),
// its cuts, and the connections it refused while cut.
func (p *Proxy) Stats() (open, cuts, refused int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns), p.cuts, p.refused
}
