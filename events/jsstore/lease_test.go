package jsstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/events/natstest"
)

// holder runs one Lease in the background: running is closed when its run
// begins, ended when that run's context ends.
type holder struct {
	lease   *jsstore.Lease
	cancel  context.CancelFunc
	done    chan struct{}
	running chan struct{}
	ended   chan struct{}
	began   time.Time
	// heldByOther is, at the moment this run began, what other.Held()
	// said (nil: the other still held the lease).
	heldByOther error
}

func startHolder(t *testing.T, js jetstream.JetStream, ttl time.Duration, other *holder) *holder {
	t.Helper()
	return startNamed(t, js, "", ttl, other)
}

func startNamed(t *testing.T, js jetstream.JetStream, name string, ttl time.Duration, other *holder) *holder {
	t.Helper()
	s, err := jsstore.New(context.Background(), js, jsstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Lease(context.Background(), "sagas.n1", jsstore.LeaseConfig{TTL: ttl, Holder: name, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &holder{lease: l, cancel: cancel, done: make(chan struct{}), running: make(chan struct{}), ended: make(chan struct{})}
	var once sync.Once
	go func() {
		defer close(h.done)
		_ = l.Run(ctx, func(ctx context.Context) error {
			once.Do(func() {
				h.began = time.Now()
				if other != nil {
					h.heldByOther = other.lease.Held()
				}
				close(h.running)
			})
			<-ctx.Done()
			select {
			case <-h.ended:
			default:
				close(h.ended)
			}
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-h.done })
	return h
}

func within(t *testing.T, c <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(d):
		t.Fatalf("%s: not within %s", what, d)
	}
}

// TestLeaseOneHolderAtATime: a second process waits while the first holds
// the lease and renews it; the first stopping releases it and the second
// takes it at once; the second cut off from NATS (a crash: no release)
// stops acting by its own clock before a third takes over, within the TTL.
func TestLeaseOneHolderAtATime(t *testing.T) {
	const ttl = 400 * time.Millisecond
	srv := natstest.Start(t)
	connect := func() jetstream.JetStream {
		js, err := jetstream.New(srv.Connect(t))
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	a := startHolder(t, connect(), ttl, nil)
	within(t, a.running, 5*time.Second, "the first holder runs")
	bConn := srv.Connect(t)
	bJS, err := jetstream.New(bConn)
	if err != nil {
		t.Fatal(err)
	}
	b := startHolder(t, bJS, ttl, a)

	// Several TTLs of renewals by a (each renewal a new revision): b waits.
	first := a.lease.Revision()
	for a.lease.Revision() < first+12 {
		select {
		case <-b.running:
			t.Fatalf("the second holder runs while the first holds the lease (revision %d)", a.lease.Revision())
		case <-time.After(ttl / 8):
		}
	}
	select {
	case <-b.running:
		t.Fatal("the second holder runs while the first holds the lease")
	default:
	}

	// A clean stop releases: b runs well before a TTL passes.
	stopped := time.Now()
	a.cancel()
	<-a.done
	within(t, b.running, ttl/2, "the second holder takes over after a release")
	t.Logf("takeover after a release: %s", b.began.Sub(stopped))
	if err := a.lease.Held(); err == nil {
		t.Error("the stopped holder still says it holds the lease")
	}

	// A crash: b's connection closes, nothing is released. c takes over
	// within the TTL (and a renewal period), and b had stopped acting
	// before.
	c := startHolder(t, connect(), ttl, b)
	bConn.Close()
	cut := time.Now()
	within(t, c.running, ttl+ttl/4+time.Second, "a third holder takes over after a crash")
	t.Logf("takeover after a crash: %s", c.began.Sub(cut))
	if c.heldByOther == nil {
		t.Error("the crashed holder still held the lease by its own clock when the next one began")
	}
	select {
	case <-b.ended:
	default:
		t.Error("the crashed holder's run was still going when the next one began")
	}
}

// TestLeaseTakenBackByItsHolder: a process that crashed holding the lease
// and starts again under the same holder name (a node's host and data
// directory) takes it back at once, not after the TTL.
func TestLeaseTakenBackByItsHolder(t *testing.T) {
	const ttl = time.Minute
	srv := natstest.Start(t)
	conn := srv.Connect(t)
	js, err := jetstream.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	a := startNamed(t, js, "host /data", ttl, nil)
	within(t, a.running, 5*time.Second, "the first run holds the lease")
	conn.Close() // the crash: nothing released
	js2, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	other := startNamed(t, js2, "other /data", ttl, nil)
	again := startNamed(t, js2, "host /data", ttl, nil)
	within(t, again.running, 5*time.Second, "the same holder starting again takes its lease back")
	select {
	case <-other.running:
		t.Error("another holder took the lease before its TTL passed")
	default:
	}
}
