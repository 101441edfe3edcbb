package kvview

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

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

// List returns the views q selects in creation order: ids are uuid v7, so
// the lexical order of ids is the order of creation. A malformed cursor,
// label or phase is an INVALID_ARGUMENT error.
func (v *View) List(ctx context.Context, q Query) (events.Page, error) {
	pq, err := q.Parse()
	if err != nil {
		return events.Page{}, err
	}
	after, limit := pq.After, pq.Limit

	keys, err := v.keys(ctx)
	if err != nil {
		return events.Page{}, fmt.Errorf("list: keys: %w", err)
	}
	sort.Strings(keys)
	keys = keys[sort.Search(len(keys), func(i int) bool { return keys[i] > after }):]

	page := events.Page{Items: make([]events.View, 0, min(limit, len(keys)))}
	for _, id := range keys {
		if !viewKey(id) {
			continue
		}
		view, err := v.Get(ctx, id)
		if errors.Is(err, events.ErrNotFound) || errors.Is(err, ErrGarbage) {
			continue // purged since the keys were listed, or not a view (counted)
		}
		if err != nil {
			return events.Page{}, fmt.Errorf("list: %w", err)
		}
		if !pq.Keeps(view) {
			continue
		}
		if len(page.Items) == limit { // one more matches: there is a next page
			page.Next = projections.Cursor(page.Items[limit-1].ID)
			break
		}
		page.Items = append(page.Items, view)
	}
	return page, nil
}

// keys lists the bucket's keys from the subject index of its stream: the
// server's answer at one point in time, which a key being rewritten never
// leaves (its new value is stored before the old one goes). A watcher of
// the bucket (KeyValue.Keys) can miss such a key: its first delivery skips
// a value replaced under it, so a List under live writes left sandboxes
// out. One answer holds up to the server's 100,000 subjects; beyond that
// the client pages, and a page boundary is no longer one point in time.
func (v *View) keys(ctx context.Context) ([]string, error) {
	s, err := v.js.Stream(ctx, "KV_"+v.cfg.Bucket)
	if err != nil {
		return nil, err
	}
	pre := "$KV." + v.cfg.Bucket + "." // as stored, whatever the domain
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(pre+">"))
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subj, pre))
	}
	return keys, nil
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
