package jsstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// LeaseBucket is the KV bucket of leases: name → the process holding it.
// A lease makes one process at a time the one that acts for a name (each
// node's saga runner holds the lease sagas.PositionKey(node)).
const LeaseBucket = "torpor_leases"

// DefaultLeaseTTL is LeaseConfig.TTL's default.
const DefaultLeaseTTL = 4 * time.Second

// LeaseConfig tunes a Lease.
type LeaseConfig struct {
	// TTL is how long a lease lasts without a renewal: a waiting process
	// takes the lease over once it has seen the key unchanged for TTL. The
	// holder renews every TTL/4 and, by its own clock, holds the lease for
	// 3/4 TTL after it sent its last renewal that succeeded: it stops
	// acting before anyone can take over (Held), even when it was paused.
	// Default DefaultLeaseTTL.
	TTL time.Duration
	// Holder names this process in the key's value (host, pid and a random
	// suffix by default). A process that finds the lease held under its own
	// name takes it at once: the name is its own from an earlier run (the
	// node names its holder by host and data directory, which one process
	// at a time uses), which ended without releasing it.
	Holder string
	// Log hears of the lease taken, waited for, lost and released.
	Log zerolog.Logger
}

// Lease is a lease on one key of LeaseBucket, with compare-and-set on the
// key's revision: the holder renews it by updating the revision it last
// wrote; a waiting process takes it over by updating the revision it saw
// unchanged for the TTL, so that two never both succeed. A holder that
// stops releases it (a delete at its revision), and a waiting process
// takes it at once.
type Lease struct {
	kv    jetstream.KeyValue
	key   string
	ttl   time.Duration
	value []byte
	log   zerolog.Logger

	mu    sync.Mutex
	until time.Time // held until then by this process's clock; zero when not held
	rev   uint64    // the key's revision this process wrote last, while held
}

// Lease creates the leases bucket, or binds to it when it exists, and
// returns the lease name (a valid KV key), not held yet: Run takes it.
func (s *Store) Lease(ctx context.Context, name string, cfg LeaseConfig) (*Lease, error) {
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      LeaseBucket,
		Description: "torpor lease name → the process holding it",
		History:     1,
		MaxBytes:    1 << 20,
		Replicas:    s.cfg.Replicas,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("lease %s: bucket %s: %w", name, LeaseBucket, natserr.Unavailable(err))
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultLeaseTTL
	}
	if cfg.Holder == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.Holder = fmt.Sprintf("%s pid %d %s", host, os.Getpid(), hex.EncodeToString(b))
	}
	return &Lease{kv: kv, key: name, ttl: cfg.TTL, value: []byte(cfg.Holder), log: cfg.Log.With().Str("lease", name).Logger()}, nil
}

// Held is nil while this process holds the lease by its own clock, and an
// UNAVAILABLE error otherwise: the holder asks before each act, so that
// one paused past its lease does not act after it wakes up.
func (l *Lease) Held() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.until.IsZero() || !time.Now().Before(l.until) {
		return events.Errorf(events.CodeUnavailable, "lease %s: not held", l.key)
	}
	return nil
}

// Revision is the key's revision this process wrote last while it holds
// the lease (a fencing token: it grows with every renewal and takeover), 0
// when it does not hold it.
func (l *Lease) Revision() uint64 {
	if l.Held() != nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev
}

// Run waits for the lease, runs run while it holds it and releases it when
// run returns. When the lease is lost (not renewed in time, or taken over)
// run's context ends; once run has returned, Run waits for the lease again
// and calls run anew. Run returns run's error, or nil when ctx ends.
func (l *Lease) Run(ctx context.Context, run func(ctx context.Context) error) error {
	for {
		if err := l.acquire(ctx); err != nil {
			return nil // ctx ended
		}
		l.log.Info().Uint64("revision", l.Revision()).Msg("lease taken")
		lost, err := l.hold(ctx, run)
		if !lost || err != nil {
			return err
		}
	}
}

// hold runs run while it renews the lease; lost says it was lost meanwhile
// (else it is released).
func (l *Lease) hold(ctx context.Context, run func(ctx context.Context) error) (lost bool, err error) {
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var gone atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		if l.keep(hctx) {
			gone.Store(true)
			cancel()
		}
	})
	err = run(hctx)
	cancel()
	wg.Wait()
	if gone.Load() {
		return true, err
	}
	l.release(context.WithoutCancel(ctx))
	return false, err
}

// keep renews the lease every TTL/4 until ctx ends (false) or the lease is
// lost (true): taken over, or not renewed before it ends.
func (l *Lease) keep(ctx context.Context) (lost bool) {
	every := l.ttl / 4
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		l.mu.Lock()
		until, rev := l.until, l.rev
		l.mu.Unlock()
		end := time.NewTimer(time.Until(until))
		select {
		case <-ctx.Done():
			end.Stop()
			return false
		case <-end.C:
			l.drop(rev)
			l.log.Warn().Uint64("revision", rev).Msg("lease lost: not renewed in time")
			return true
		case <-tick.C:
			end.Stop()
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, every)
		next, err := l.kv.Update(rctx, l.key, l.value, rev)
		cancel()
		switch {
		case err == nil:
			l.set(next, sent)
		case ctx.Err() != nil:
			return false
		case wrongLast(err):
			l.drop(rev)
			l.log.Warn().Uint64("revision", rev).Msg("lease lost: taken over")
			return true
		default:
			l.log.Warn().Err(err).Uint64("revision", rev).Msg("lease not renewed; trying again")
		}
	}
}

// set records revision rev written by a request sent at sent: held for
// 3/4 TTL from then, a quarter before a waiting process may take over.
func (l *Lease) set(rev uint64, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rev, l.until = rev, sent.Add(l.ttl*3/4)
}

// drop forgets the lease held at revision rev.
func (l *Lease) drop(rev uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rev == rev {
		l.until = time.Time{}
	}
}

// release deletes the key at the revision last written, when the lease is
// still held: a waiting process takes it at once.
func (l *Lease) release(ctx context.Context) {
	rev := l.Revision()
	if rev == 0 {
		return
	}
	l.drop(rev)
	ctx, cancel := context.WithTimeout(ctx, l.ttl/4)
	defer cancel()
	if err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev)); err != nil {
		l.log.Warn().Err(err).Uint64("revision", rev).Msg("lease not released: the next holder takes it once it ends")
		return
	}
	l.log.Info().Uint64("revision", rev).Msg("lease released")
}

// acquire returns once this process holds the lease, or ctx's error.
func (l *Lease) acquire(ctx context.Context) error {
	waiting := false
	for {
		sent := time.Now()
		rev, err := l.kv.Create(ctx, l.key, l.value)
		switch {
		case err == nil:
			l.set(rev, sent)
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !wrongLast(err):
			l.log.Warn().Err(err).Msg("lease not taken; trying again")
			if !pause(ctx, l.ttl/4) {
				return ctx.Err()
			}
			continue
		}
		if !waiting {
			waiting = true
			holder := ""
			if e, err := l.kv.Get(ctx, l.key); err == nil {
				holder = string(e.Value())
				if holder == string(l.value) {
					// Held under our own name: by an earlier run of ours.
					sent := time.Now()
					if rev, err := l.kv.Update(ctx, l.key, l.value, e.Revision()); err == nil {
						l.set(rev, sent)
						l.log.Info().Uint64("revision", e.Revision()).Msg("lease taken back from an earlier run of this holder")
						return nil
					}
					continue
				}
			}
			l.log.Info().Str("holder", holder).Dur("ttl", l.ttl).Msg("lease held by another process: waiting for it")
		}
		took, err := l.await(ctx)
		if took || err != nil {
			return err
		}
	}
}

// await watches the key held by another process: it takes the lease over
// (true) when the key stays unchanged for the TTL, and returns false when
// the key is released (or the watch ends): the caller creates it again.
func (l *Lease) await(ctx context.Context) (took bool, err error) {
	w, err := l.kv.Watch(ctx, l.key)
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		l.log.Warn().Err(err).Msg("lease not watched; trying again")
		return false, nil
	}
	defer func() { _ = w.Stop() }()
	var seen uint64
	end := time.NewTimer(time.Hour)
	end.Stop()
	defer end.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return false, nil
			case e == nil: // the watch is up to date
				if seen == 0 {
					return false, nil // gone before the watch began
				}
			case e.Operation() != jetstream.KeyValuePut:
				return false, nil // released
			default:
				seen = e.Revision()
				end.Reset(l.ttl)
			}
		case <-end.C:
			sent := time.Now()
			rev, err := l.kv.Update(ctx, l.key, l.value, seen)
			switch {
			case err == nil:
				l.set(rev, sent)
				l.log.Warn().Uint64("revision", seen).Dur("ttl", l.ttl).Msg("lease taken over: its holder did not renew it")
				return true, nil
			case ctx.Err() != nil:
				return false, ctx.Err()
			case wrongLast(err):
				// Renewed or taken meanwhile, and the watch missed it: watch
				// afresh.
				return false, nil
			default:
				l.log.Warn().Err(err).Msg("lease not taken over; trying again")
				end.Reset(l.ttl / 4)
			}
		}
	}
}

// wrongLast says whether err is a KV write that lost to another writer.
func wrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && (apiErr.ErrorCode == codeWrongLastSequence || apiErr.ErrorCode == codeWrongLastSequenceConstant))
}

// pause waits d; false if ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
