package kvview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/projections"
)

// Page sizes of List and its Query are the projections package's, shared
// by every view.
const (
	DefaultLimit = projections.DefaultLimit
	MaxLimit     = projections.MaxLimit
)

// Query selects the views List returns (projections.Query).
type Query = projections.Query

// List returns the page of the views q selects in q's order (creation
// order by default: ids are uuid v7, so the lexical order of ids is the
// order of creation), with the number of views it selects over all pages.
// A malformed cursor, label, phase or sort, or a cursor of another sort, is
// an INVALID_ARGUMENT error.
//
// How it reads: the bucket's current values in one stream (current), not
// the keys and then a Get per view as before, which took a round trip per
// view: at 10,000 sandboxes a page took seconds, and a filter that kept few
// views read them all one at a time. The stream is pulled a megabyte at a
// time, so a page of any order, and its total, cost the size of the bucket
// in bytes but a few round trips. Why not an index kept in memory, fed by a
// watch of the bucket, which would answer without reading the bucket: it
// holds the whole fleet in each gateway for all the time it runs (the
// Follower keeps only the last changes, whatever the size of the fleet, on
// purpose), it answers from the past until its watch caught up with a
// write, and it has to be rebuilt whenever its watch is lost. A list reads
// the bucket as it is when it asks, as Get does.
func (v *View) List(ctx context.Context, q Query) (events.Page, error) {
	pq, err := q.Parse()
	if err != nil {
		return events.Page{}, err
	}
	// Every view the query keeps, by key: a key read again (written while
	// the stream was read) is replaced, one deleted meanwhile leaves.
	kept := map[string]events.View{}
	err = v.current(ctx, func(key string, raw []byte, rev uint64) {
		delete(kept, key)
		if raw == nil {
			return
		}
		view, err := decodeView(key, raw, rev)
		if err != nil {
			v.garbage.Add(1)
			return // not a view: passed over, counted
		}
		if pq.Keeps(view) {
			kept[key] = view
		}
	})
	if err != nil {
		return events.Page{}, fmt.Errorf("list: %w", err)
	}
	page := events.Page{Items: make([]events.View, 0, min(pq.Limit, len(kept))), Total: len(kept)}
	rest := make([]events.View, 0, len(kept))
	for _, view := range kept {
		if pq.Past(view) {
			rest = append(rest, view)
		}
	}
	slices.SortFunc(rest, pq.Compare)
	if len(rest) > pq.Limit { // one more matches: there is a next page
		rest = rest[:pq.Limit]
		page.Next = pq.Next(rest[pq.Limit-1])
	}
	page.Items = append(page.Items, rest...)
	return page, nil
}

// A list pulls the bucket's values listBatch at a time, each pull
// answered with what the stream holds at once (no wait for more).
const listBatch = 512

// listStall is how long a list waits for pulls that bring nothing while
// the stream holds more (a replica catching up) before it answers
// UNAVAILABLE, which clients retry.
var listStall = 5 * time.Second

// current hands fn the current value of every key of the bucket that can
// be a view, in the order the bucket's stream holds them, through a pull
// consumer of its own that it deletes after: a key written again while it
// reads comes again with its new value, and a key deleted meanwhile with
// raw nil; rev is the value's revision.
//
// It ends once it has read past the last message the stream holds (its
// LastSeq, asked when the consumer says nothing is pending): every message
// the bucket holds then is at or below that sequence, so it came, and so
// every key the bucket holds at that time came with its current value. The
// consumer's pending count alone does not tell: the server decrements it
// twice for a value replaced ahead of the reader under contention (its
// checkNumPending says so), and a list under live writes left a view out
// (TestRebuildUnderLiveTraffic polls List).
func (v *View) current(ctx context.Context, fn func(key string, raw []byte, rev uint64)) error {
	stream, err := v.js.Stream(ctx, "KV_"+v.cfg.Bucket)
	if err != nil {
		return err
	}
	pre := "$KV." + v.cfg.Bucket + "." // as stored, whatever the domain
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		FilterSubject:     pre + ">",
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute, // if the deletion below is lost
	})
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
		cancel()
	}()
	var read uint64                  // the stream sequence read up to
	progress := time.Now()           // when a pull last brought something
	backoff := 10 * time.Millisecond // between pulls that brought nothing
	past := func() (bool, error) {
		info, err := stream.Info(ctx)
		if err != nil {
			return false, err
		}
		return info.State.Msgs == 0 || read >= info.State.LastSeq, nil
	}
	if cons.CachedInfo().NumPending == 0 {
		if done, err := past(); done || err != nil {
			return err // an empty bucket
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch, err := cons.FetchNoWait(listBatch)
		if err != nil {
			return err
		}
		n, caughtUp := 0, false
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return err
			}
			read = max(read, meta.Sequence.Stream)
			if key := strings.TrimPrefix(m.Subject(), pre); viewKey(key) {
				if m.Headers().Get("KV-Operation") != "" { // deleted or purged
					fn(key, nil, meta.Sequence.Stream)
				} else {
					fn(key, m.Data(), meta.Sequence.Stream)
				}
			}
			if meta.NumPending == 0 {
				caughtUp = true // the rest of the batch is read all the same
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
		if n > 0 {
			progress, backoff = time.Now(), 10*time.Millisecond
		}
		if caughtUp || n == 0 {
			done, err := past()
			if err != nil || done {
				return err
			}
			if n == 0 {
				// The consumer's leader may sit on a replica still
				// catching up with the stream (a server that came back
				// without its store): it is waited for, a while.
				if time.Since(progress) > listStall {
					return events.Errorf(events.CodeUnavailable, "read %s: nothing came past seq %d in %s", v.cfg.Bucket, read, listStall)
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 500*time.Millisecond)
			}
		}
	}
}

// Counts returns how many sandboxes are in each phase; every phase of the
// contract is present, zero or not.
func (v *View) Counts(ctx context.Context) (map[events.Phase]int, error) {
	counts := make(map[events.Phase]int, len(events.Phases))
	for _, p := range events.Phases {
		counts[p] = 0
	}
	err := v.scan(ctx, func(view events.View) { counts[view.Phase]++ })
	if err != nil {
		return nil, fmt.Errorf("counts: %w", err)
	}
	return counts, nil
}

// scan calls fn with the current view of every key.
func (v *View) scan(ctx context.Context, fn func(events.View)) error {
	w, err := v.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("watch %s: %w", v.cfg.Bucket, err)
	}
	defer stop(w)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("watch %s: closed", v.cfg.Bucket)
			}
			if e == nil { // every current value delivered
				return nil
			}
			if !viewKey(e.Key()) {
				continue
			}
			view, err := decode(e)
			if err != nil {
				v.garbage.Add(1)
				continue // not a view: passed over, counted
			}
			fn(view)
		}
	}
}

// stop ends a watcher and drains it until the library closes its channel, so
// that no delivery stays blocked on a full channel.
func stop(w jetstream.KeyWatcher) {
	_ = w.Stop()
	for range w.Updates() {
	}
}
