package kvview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
)

// conflictRetries bounds how often Apply reloads a view that another writer
// changed under it.
const conflictRetries = 3

// Apply folds env into its sandbox's view and stores the result. An event the
// view already holds (a seq at or below the view's) or of an unknown type
// changes nothing, so redeliveries are harmless. The write is conditional on
// the revision read, so even two writers never move a view back.
func (v *View) Apply(ctx context.Context, env events.Envelope) error {
	id := env.SandboxID
	if !validKey(id) {
		return fmt.Errorf("apply %s seq %d: invalid sandbox id %q", env.Type, env.Seq, id)
	}
	if env.Seq == 0 { // Fold would take it and set the view's seq back to 0
		return fmt.Errorf("apply %s to %s: no stream sequence", env.Type, id)
	}
	for try := 0; ; try++ {
		cur, err := v.current(ctx, id)
		if err != nil {
			return fmt.Errorf("apply %s seq %d: %w", env.Type, env.Seq, err)
		}
		next := cur.view
		if !next.Fold(env) {
			return nil
		}
		data, err := json.Marshal(next)
		if err != nil {
			return fmt.Errorf("apply %s seq %d: encode view: %w", env.Type, env.Seq, err)
		}
		rev, err := v.kv.Update(ctx, id, data, cur.rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) && try < conflictRetries {
			v.forget(id)
			continue
		}
		if err != nil {
			v.forget(id)
			return fmt.Errorf("apply %s seq %d: put %s: %w", env.Type, env.Seq, id, err)
		}
		v.remember(id, entry{view: next, rev: rev})
		return nil
	}
}

// current is the view of id as last written: from the cache, else the
// bucket, else empty at revision 0.
func (v *View) current(ctx context.Context, id string) (entry, error) {
	v.mu.Lock()
	e, ok := v.cache[id]
	v.mu.Unlock()
	if ok {
		return e, nil
	}
	view, rev, err := v.load(ctx, id)
	if errors.Is(err, events.ErrNotFound) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, err
	}
	return entry{view: view, rev: rev}, nil
}

func (v *View) remember(id string, e entry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.cache[id]; !ok && len(v.cache) >= v.cfg.CacheSize {
		for k := range v.cache { // evict one arbitrary entry
			delete(v.cache, k)
			break
		}
	}
	v.cache[id] = e
}

func (v *View) forget(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.cache, id)
}
