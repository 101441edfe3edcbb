package bench

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// HTTPLoop is the closed loop as users drive it over the HTTP API: each
// client sends the command with ?wait=true through the Go SDK
// (LifecycleWait), one round trip that answers the outcome's view, where
// the pipeline's closed loop watches the KV view itself.
type HTTPLoop struct {
	Concurrency     int     `json:"concurrency"`
	Seconds         float64 `json:"seconds"`
	Transitions     int64   `json:"transitions"`
	TransitionsPerS float64 `json:"transitions_per_s"`
	P50             float64 `json:"p50_ms"`
	P90             float64 `json:"p90_ms"`
	P99             float64 `json:"p99_ms"`
	// CPUMsPerTransition and CoresBusy: as in Pipeline.
	CPUMsPerTransition float64 `json:"cpu_ms_per_transition"`
	CoresBusy          float64 `json:"cores_busy"`
}

// httpClient is an SDK client of the service svc, with its admin token, for conns clients at
// once. Go's default transport keeps two idle connections per host, so a
// load of more clients than that would open a connection for nearly every
// request and measure the kernel's TCP set-up.
func httpClient(svc Service, conns int) *torpor.Client {
	return torpor.New(svc.HTTPAddr(), &http.Client{Transport: benchTransport(conns)}).WithToken(svc.AdminToken())
}

// benchTransport is Go's default transport keeping conns idle connections.
func benchTransport(conns int) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = conns, conns
	return t
}

// waitStep sends verb to id over HTTP with ?wait=true and takes the
// outcome's view it answers (one round trip), as the CLI does; target is
// the phase it must be.
func waitStep(c *torpor.Client) stepFunc {
	return func(ctx context.Context, verb, id string, target events.Phase) error {
		v, err := c.LifecycleWait(ctx, verb, id, torpor.ResumeOptions{}, "", 30*time.Second)
		if err != nil {
			return fmt.Errorf("%s %s: wait for %s: %w", verb, id, target, err)
		}
		if v.Phase != target {
			return fmt.Errorf("%s %s: waited for %s, the view is %s", verb, id, target, v.Phase)
		}
		return nil
	}
}

// httpLoop runs the closed loop over HTTP on ids with c clients for d.
func httpLoop(ctx context.Context, svc Service, ids []string, c int, d time.Duration) (HTTPLoop, error) {
	r := HTTPLoop{Concurrency: c}
	cl, err := costOf(svc.Server(), func() (int, error) {
		res, err := cycle(ctx, waitStep(httpClient(svc, c)), ids, c, d)
		r.Seconds, r.Transitions = res.secs, res.transitions
		r.P50, r.P90, r.P99, _ = percentiles(res.lats)
		return int(res.transitions), err
	})
	if err != nil {
		return r, fmt.Errorf("http closed loop: %w", err)
	}
	r.TransitionsPerS = float64(r.Transitions) / r.Seconds
	r.CPUMsPerTransition, r.CoresBusy = cl.msPerTransition, cl.coresBusy
	return r, nil
}
