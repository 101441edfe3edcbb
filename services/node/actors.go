package node

import (
	"context"
	"fmt"
	"sync"

	"github.com/rs/zerolog"
)

// actor is a long-running part of a node: it runs until its context ends,
// and returns early only when it fails (or cannot go on).
type actor struct {
	name   string
	ctx    context.Context
	cancel context.CancelFunc
	run    func(ctx context.Context) error
}

// actors are a node's long-running parts, in the order they start. Each
// has a context of its own, so that they stop one at a time, in the
// reverse order: the HTTP API (started last) stops taking requests before
// the views, the sagas and the bus it leans on stop (oklog/run's shape,
// with an order).
type actors struct {
	base context.Context
	list []*actor
}

func newActors(ctx context.Context) *actors {
	return &actors{base: context.WithoutCancel(ctx)}
}

// add adds the part name, run, and returns the context it will run with,
// for what is set up before it runs (subscriptions bound to it).
func (g *actors) add(name string, run func(ctx context.Context) error) context.Context {
	ctx, cancel := context.WithCancel(g.base)
	g.list = append(g.list, &actor{name: name, ctx: ctx, cancel: cancel, run: run})
	return ctx
}

// cancel ends every part's context at once: for a start that fails before
// they run.
func (g *actors) cancel() {
	for _, a := range g.list {
		a.cancel()
	}
}

// run runs every part until ctx ends or one of them returns, then stops
// them in the reverse order of their start, each one waited for before
// the one before it is stopped. It returns the first error a part
// returned, naming the part; a part that returns early without one stops
// the node too.
func (g *actors) run(ctx context.Context, log zerolog.Logger) error {
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(g.list))
	done := make([]chan error, len(g.list))
	var wg sync.WaitGroup
	for i, a := range g.list {
		done[i] = make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := a.run(a.ctx)
			done[i] <- err
			results <- result{i, err}
		}()
	}
	var first error
	select {
	case <-ctx.Done():
	case r := <-results:
		a := g.list[r.i]
		if r.err != nil {
			first = fmt.Errorf("%s: %w", a.name, r.err)
			log.Error().Err(r.err).Str("part", a.name).Msg("stopped with an error; stopping the node")
		} else if a.ctx.Err() == nil {
			log.Warn().Str("part", a.name).Msg("stopped before the node did; stopping the node")
		}
	}
	for i := len(g.list) - 1; i >= 0; i-- {
		a := g.list[i]
		a.cancel()
		if err := <-done[i]; err != nil && first == nil {
			first = fmt.Errorf("%s: %w", a.name, err)
			log.Error().Err(err).Str("part", a.name).Msg("stopped with an error")
		}
	}
	wg.Wait()
	return first
}
