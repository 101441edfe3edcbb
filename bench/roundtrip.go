package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// RoundTrip is a bare request-reply measured with the closed loop's clients:
// a command-sized request answered with a view-sized reply, no JSON and no
// work on either side. Over HTTP it is net/http's client and server on
// loopback, one keep-alive connection per client, configured as the SDK's
// and serve's are; over the bus it is a core NATS request to a responder on
// a connection of its own, as a bus command is. CPUMicros is this process's
// CPU time per round trip, client and server together (zero where the OS
// gives no CPU time).
type RoundTrip struct {
	Concurrency int     `json:"concurrency"`
	PerS        float64 `json:"per_s"`
	CPUMicros   float64 `json:"cpu_us"`
}

// Bodies of the bare round trips: about a lifecycle command's request and
// the view a wait answers.
var (
	rtRequest = bytes.Repeat([]byte{'c'}, 64)
	rtReply   = bytes.Repeat([]byte{'v'}, 300)
)

// roundTrips measures the bare HTTP round trip and the bare bus
// request-reply, each with c clients for d. They bound what the closed
// loop over HTTP can reach next to the bus's (httpCeiling): per transition
// a client over HTTP makes one round trip (the command with ?wait=true,
// answered with its outcome) where a client over the bus makes one request
// (and learns the outcome from a watch the service has anyway).
func roundTrips(ctx context.Context, nc *nats.Conn, c int, d time.Duration) (h, b RoundTrip, err error) {
	if h, err = httpRoundTrip(ctx, c, d); err != nil {
		return h, b, fmt.Errorf("raw HTTP round trip: %w", err)
	}
	if b, err = busRequest(ctx, nc, c, d); err != nil {
		return h, b, fmt.Errorf("raw bus request: %w", err)
	}
	return h, b, nil
}

func httpRoundTrip(ctx context.Context, c int, d time.Duration) (RoundTrip, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return RoundTrip{}, err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(rtReply)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	hc := &http.Client{Transport: benchTransport(c)}
	defer hc.CloseIdleConnections()
	url := "http://" + ln.Addr().String() + "/v1/sandboxes/x/suspend"
	return clientsLoop(c, d, func(int, int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(rtRequest))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err == nil && len(data) != len(rtReply) {
			err = fmt.Errorf("a reply of %d bytes, not %d", len(data), len(rtReply))
		}
		return err
	})
}

func busRequest(ctx context.Context, nc *nats.Conn, c int, d time.Duration) (RoundTrip, error) {
	rc, err := connectAgain(nc)
	if err != nil {
		return RoundTrip{}, err
	}
	defer rc.Close()
	const subj = "bench.raw.request"
	sub, err := rc.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond(rtReply) })
	if err != nil {
		return RoundTrip{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := rc.Flush(); err != nil {
		return RoundTrip{}, err
	}
	return clientsLoop(c, d, func(int, int) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		m, err := nc.RequestWithContext(ctx, subj, rtRequest)
		if err == nil && len(m.Data) != len(rtReply) {
			err = fmt.Errorf("a reply of %d bytes, not %d", len(m.Data), len(rtReply))
		}
		return err
	})
}

// clientsLoop runs once on c clients, each in a loop, for d, and says how
// many it completed per second and the CPU time each took. once is called
// with its client w (0 to c-1) and how many calls w completed before; the
// first error of a client ends that client's loop, and the run fails.
func clientsLoop(c int, d time.Duration, once func(w, i int) error) (RoundTrip, error) {
	r := RoundTrip{Concurrency: c}
	var (
		wg    sync.WaitGroup
		n     atomic.Int64
		errMu sync.Mutex
		errs  error
	)
	cpu0, cpuErr := processCPU()
	start := time.Now()
	until := start.Add(d)
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(until); i++ {
				if err := once(w, i); err != nil {
					errMu.Lock()
					errs = errors.Join(errs, err)
					errMu.Unlock()
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	if errs != nil {
		return r, errs
	}
	r.PerS = float64(n.Load()) / secs
	if cpu1, err := processCPU(); cpuErr == nil && err == nil && n.Load() > 0 {
		r.CPUMicros = float64((cpu1 - cpu0).Microseconds()) / float64(n.Load())
	}
	return r, nil
}

// httpCeiling is the most transitions the closed loop over HTTP can make
// per CPU second next to the bus's, from the bare round trips: a transition
// over HTTP costs at least what one over the bus costs (busMs CPU), less the
// bus request, plus one HTTP round trip (the command with ?wait=true), even
// if everything else (the command's work, the view, the outcome's answer
// from the follower) cost no
// more over HTTP than over the bus. Where the cores are what limits both
// loops at the same share of them busy, it bounds the ratio of their
// transitions/s. Zero where a figure is missing.
func httpCeiling(busMs float64, h, b RoundTrip) float64 {
	if busMs <= 0 || h.CPUMicros <= 0 || b.CPUMicros <= 0 {
		return 0
	}
	return busMs / (busMs + (h.CPUMicros-b.CPUMicros)/1000)
}
