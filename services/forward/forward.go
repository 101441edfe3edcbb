// Package forward serves sandboxes' TCP forwards (CONTRACT §5): a listener
// on torpor's host per forward, each connection piped to a port of the
// sandbox through its driver. A forward is never torn down by a suspension:
// while the sandbox is not running, a new connection is held for a few
// seconds and then refused with a line that says why; once it runs again
// the forward carries traffic again. Bytes through a forward, either way,
// are activity of its sandbox (README "Activity"): counted, and reported at
// most once per activity window per sandbox, never once per packet.
package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
)

// Sandboxes is what the forwarder asks of the rest of torpor.
type Sandboxes interface {
	// Phase is sandbox id's phase now, and whether its forward fid is open.
	Phase(ctx context.Context, id, fid string) (phase events.Phase, open bool, err error)
	// Dial connects to port of sandbox id's workload.
	Dial(ctx context.Context, id string, port int) (net.Conn, error)
}

// Activity is what a Sandboxes may also be: the taker of its sandboxes'
// activity. A forwarder over one reports bytes through a forward of
// sandbox id, first seen at at, at most once per Config.Window per sandbox
// (on a goroutine of its own: traffic never waits for the report).
type Activity interface {
	Active(ctx context.Context, id string, at time.Time) error
}

// Config tunes a Forwarder.
type Config struct {
	// Hold is how long a connection to a sandbox that is not running waits
	// for it before it is refused (default 5s).
	Hold time.Duration
	// Poll is how often a held connection looks at the sandbox's phase
	// again (default 50ms).
	Poll time.Duration
	// DialTimeout bounds a connection to the sandbox (default 5s).
	DialTimeout time.Duration
	// Sweep is how often Run closes the forwards that were closed or whose
	// sandbox was deleted meanwhile (default 10s).
	Sweep time.Duration
	// WakeTimeout bounds how long a connection that woke its sandbox
	// (wake_on_traffic) waits for it to be ready (default 30s); MaxHeld
	// how many such connections a sandbox holds at once (default 64):
	// one more is refused at once. See wake.go.
	WakeTimeout time.Duration
	MaxHeld     int
	// Metrics counts the wakes and their latency.
	Metrics *metrics.Set
	// Window is the activity window: bytes through the forwards of one
	// sandbox are reported (Activity) at most once per window (default
	// 30s, serve --activity-window).
	Window time.Duration
	// Now is the clock activity is timed by (default time.Now).
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Hold == 0 {
		c.Hold = 5 * time.Second
	}
	if c.Poll == 0 {
		c.Poll = 50 * time.Millisecond
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.Sweep == 0 {
		c.Sweep = 10 * time.Second
	}
	if c.WakeTimeout == 0 {
		c.WakeTimeout = 30 * time.Second
	}
	if c.MaxHeld == 0 {
		c.MaxHeld = 64
	}
	if c.Window == 0 {
		c.Window = 30 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Forwarder serves the forwards of one torpor process. Its zero value is
// not usable; call New. Shut ends every forward and waits for them.
type Forwarder struct {
	sb  Sandboxes
	idx Index
	cfg Config
	log zerolog.Logger

	mu     sync.Mutex
	closed bool
	fws    map[string]*served // by forward id
	wg     sync.WaitGroup
	held   holds // connections held for a wake, per sandbox

	// reported is when activity of each sandbox was last reported.
	amu      sync.Mutex
	reported map[string]time.Time
}

// served is one forward's listener and its connections.
type served struct {
	id, sandbox string
	port        int
	ln          net.Listener
	serving     bool
	conns       map[net.Conn]bool
}

// New returns a forwarder over sb that keeps where its forwards are bound
// in idx.
func New(sb Sandboxes, idx Index, cfg Config, log zerolog.Logger) *Forwarder {
	return &Forwarder{sb: sb, idx: idx, cfg: cfg.withDefaults(), log: log, fws: map[string]*served{}, reported: map[string]time.Time{}}
}

// ErrNothingListens: the sandbox's port takes no connection.
var ErrNothingListens = errors.New("nothing listens on the port")

// Bind listens on listen ("127.0.0.1:0" picks a port) for forward fid to
// port of sandbox id and returns the address it bound; it serves nothing
// until Serve. Something must listen on the port in the sandbox now (it is
// dialled once), unless probe is false (a forward brought back after a
// restart, whose sandbox may be suspended). A forward bound already
// answers its address again.
func (f *Forwarder) Bind(ctx context.Context, id, fid, listen string, port int, probe bool) (string, error) {
	f.mu.Lock()
	if s, ok := f.fws[fid]; ok {
		f.mu.Unlock()
		return s.ln.Addr().String(), nil
	}
	f.mu.Unlock()
	if probe {
		dctx, cancel := context.WithTimeout(ctx, f.cfg.DialTimeout)
		c, err := f.sb.Dial(dctx, id, port)
		cancel()
		if err != nil {
			return "", fmt.Errorf("forward to port %d of %s: %w: %w", port, id, ErrNothingListens, err)
		}
		_ = c.Close()
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return "", fmt.Errorf("forward to port %d of %s: listen on %s: %w", port, id, listen, err)
	}
	addr := ln.Addr().String()
	// Indexed before its event is appended: a forward in the log is in the
	// index, and a restart finds it (an entry whose event never landed is
	// dropped then).
	if err := f.idx.Put(ctx, fid, Entry{Sandbox: id, Address: addr, Port: port}); err != nil {
		_ = ln.Close()
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		_ = ln.Close()
		return "", errors.New("forwarder closed")
	}
	if s, ok := f.fws[fid]; ok { // bound meanwhile by a twin call
		_ = ln.Close()
		return s.ln.Addr().String(), nil
	}
	f.fws[fid] = &served{id: fid, sandbox: id, port: port, ln: ln, conns: map[net.Conn]bool{}}
	return addr, nil
}

// Serve starts serving the bound forward fid; a second call does nothing.
func (f *Forwarder) Serve(fid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.fws[fid]
	if !ok || s.serving || f.closed {
		return
	}
	s.serving = true
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.accept(s)
	}()
}

// Close ends forward fid (its listener and its connections) and forgets
// it in the index.
func (f *Forwarder) Close(fid string) {
	f.mu.Lock()
	s, ok := f.fws[fid]
	delete(f.fws, fid)
	f.mu.Unlock()
	if ok {
		f.end(s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.idx.Delete(ctx, fid); err != nil {
		f.log.Warn().Err(err).Str("forward", fid).Msg("forget a closed forward")
	}
}

// Shut ends every forward and waits for their goroutines (the sandboxes'
// forwards are in the log: a restart brings them back).
func (f *Forwarder) Shut() {
	f.mu.Lock()
	f.closed = true
	all := f.fws
	f.fws = map[string]*served{}
	f.mu.Unlock()
	for _, s := range all {
		f.end(s)
	}
	f.wg.Wait()
}

func (f *Forwarder) end(s *served) {
	_ = s.ln.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range s.conns {
		_ = c.Close()
	}
}

// Run closes, every Config.Sweep until ctx ends, the forwards that are no
// longer open in the log (closed by another instance, or their sandbox
// deleted), then Shut.
func (f *Forwarder) Run(ctx context.Context) {
	defer f.Shut()
	t := time.NewTicker(f.cfg.Sweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.forgetActivity()
		f.mu.Lock()
		all := make([]*served, 0, len(f.fws))
		for _, s := range f.fws {
			all = append(all, s)
		}
		f.mu.Unlock()
		for _, s := range all {
			if phase, open, err := f.sb.Phase(ctx, s.sandbox, s.id); err == nil && (!open || phase == events.PhaseDeleted) {
				f.Close(s.id)
			}
		}
	}
}

// Restore binds and serves again, after a restart, the forwards of the
// index whose sandboxes still have them open (at the addresses they were
// bound on; the sandboxes are not dialled: one may be suspended), and drops
// the others. A forward that cannot be bound again is logged and left in
// the index for the next start. It returns how many it serves.
func (f *Forwarder) Restore(ctx context.Context) (int, error) {
	all, err := f.idx.All(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for fid, e := range all {
		phase, open, err := f.sb.Phase(ctx, e.Sandbox, fid)
		switch {
		case err != nil && events.CodeOf(err) != events.CodeNotFound:
			f.log.Warn().Err(err).Str("sandbox_id", e.Sandbox).Str("forward", fid).Msg("forward not brought back")
			continue
		case err != nil || !open || phase == events.PhaseDeleted:
			_ = f.idx.Delete(ctx, fid)
			continue
		}
		if _, err := f.Bind(ctx, e.Sandbox, fid, e.Address, e.Port, false); err != nil {
			f.log.Warn().Err(err).Str("sandbox_id", e.Sandbox).Str("forward", fid).Msg("forward not brought back")
			continue
		}
		f.Serve(fid)
		n++
	}
	return n, nil
}

// Address is the address forward fid is bound on, if it is.
func (f *Forwarder) Address(fid string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.fws[fid]
	if !ok {
		return "", false
	}
	return s.ln.Addr().String(), true
}

func (f *Forwarder) accept(s *served) {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		if !f.track(s, c, true) {
			_ = c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.track(s, c, false)
			f.carry(s, c)
		}()
	}
}

// track notes (or forgets) a connection of s, so that closing s ends it;
// false when s is closed already.
func (f *Forwarder) track(s *served, c net.Conn, add bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !add {
		delete(s.conns, c)
		return true
	}
	if f.fws[s.id] != s {
		return false
	}
	s.conns[c] = true
	return true
}

// carry pipes one connection to the sandbox once it runs, holding it up to
// Config.Hold while it does not, and refusing it with a line that says why
// after that.
func (f *Forwarder) carry(s *served, c net.Conn) {
	defer c.Close()
	ctx := context.Background()
	accepted := time.Now()
	woken, refused := f.wake(ctx, s, c)
	if refused {
		return
	}
	deadline := time.Now().Add(f.cfg.Hold)
	for {
		phase, open, err := f.sb.Phase(ctx, s.sandbox, s.id)
		switch {
		case err != nil:
			refuse(c, fmt.Sprintf("sandbox %s: %v", s.sandbox, err))
			return
		case !open || phase == events.PhaseDeleted:
			refuse(c, fmt.Sprintf("forward %s of sandbox %s is closed", s.id, s.sandbox))
			go f.Close(s.id)
			return
		}
		if phase == events.PhaseReady {
			break
		}
		if !waitable(phase) || time.Now().After(deadline) {
			refuse(c, fmt.Sprintf("sandbox %s is %s; the connection is refused", s.sandbox, phase))
			return
		}
		time.Sleep(f.cfg.Poll)
	}
	dctx, cancel := context.WithTimeout(ctx, f.cfg.DialTimeout)
	up, err := f.sb.Dial(dctx, s.sandbox, s.port)
	cancel()
	if err != nil {
		refuse(c, fmt.Sprintf("sandbox %s port %d: %v", s.sandbox, s.port, err))
		return
	}
	defer up.Close()
	if !f.track(s, up, true) {
		return
	}
	defer f.track(s, up, false)
	done := make(chan struct{})
	var to io.Writer = up
	if woken {
		to = &firstWrite{w: up, first: func() { f.cfg.Metrics.WakeLatency(time.Since(accepted)) }}
	}
	go func() {
		_, _ = io.Copy(to, counted{c, f, s.sandbox})
		closeWrite(up)
		close(done)
	}()
	_, _ = io.Copy(c, counted{up, f, s.sandbox})
	closeWrite(c)
	<-done
}

// waitable says whether a sandbox in phase p may run again soon: a held
// connection waits for it.
func waitable(p events.Phase) bool {
	return p == events.PhaseSuspended || p.Transient() && p != events.PhaseDeleting
}

// refuse tells the client why in one line and closes.
func refuse(c net.Conn, why string) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(c, "torpor: "+why+"\r\n")
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
}

// counted is a connection's reader whose bytes are activity of sandbox.
type counted struct {
	r       io.Reader
	f       *Forwarder
	sandbox string
}

func (c counted) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.f.active(c.sandbox)
	}
	return n, err
}

// active notes bytes through a forward of sandbox id: the first in a
// window is reported, on a goroutine (the forwarder's Shut waits for it),
// the rest only counted against it.
func (f *Forwarder) active(id string) {
	act, ok := f.sb.(Activity)
	if !ok {
		return
	}
	now := f.cfg.Now()
	f.amu.Lock()
	if last, seen := f.reported[id]; seen && now.Sub(last) < f.cfg.Window {
		f.amu.Unlock()
		return
	}
	f.reported[id] = now
	f.amu.Unlock()
	f.wg.Add(1) // within carry's own count: never after Shut's Wait returned
	go func() {
		defer f.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), f.cfg.DialTimeout)
		defer cancel()
		if err := act.Active(ctx, id, now); err != nil {
			f.log.Debug().Err(err).Str("sandbox_id", id).Msg("activity not recorded")
		}
	}()
}

// forgetActivity drops what it noted of sandboxes whose window is over.
func (f *Forwarder) forgetActivity() {
	now := f.cfg.Now()
	f.amu.Lock()
	defer f.amu.Unlock()
	for id, at := range f.reported {
		if now.Sub(at) >= f.cfg.Window {
			delete(f.reported, id)
		}
	}
}
