package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Raw is the denominator: the bus itself, on the same server, in the
// same run.
type Raw struct {
	AppendCheckSyncEPS  float64 `json:"append_check_sync_eps"`
	AppendCheckAsyncEPS float64 `json:"append_check_async_eps"`
	OrderedReadEPS      float64 `json:"ordered_read_eps"`
	// BusFloorEPS is the async append with the bus work the pipeline does
	// per event and cannot do without, and none of its logic: half a KV
	// put, a delivery to an ordered consumer, half a KV watch delivery.
	BusFloorEPS float64 `json:"bus_floor_eps"`
	KVPutEPS    float64 `json:"kv_put_eps"`
	// AppendLatency is one append with the check at a time, at the offered
	// rate of the pipeline's latency run: the tail every hop of the
	// pipeline's path has on this machine.
	AppendLatency *Latency `json:"append_latency_ms,omitempty"`
	// SQLUpsertEPS is the rows/s of batched upserts of phase-view rows, each
	// transaction with its checkpoint (measureSQLUpsert), the denominator of a
	// SQL view's rebuild; absent without --database-url. It does not depend
	// on the bus: every mode carries the same figure.
	SQLUpsertEPS *float64 `json:"sql_upsert_eps,omitempty"`
	Messages     int      `json:"messages"`
	// HTTPRoundTrip and BusRequest are the bare request-replies of the two
	// command paths, with the closed loop's clients (roundTrips).
	HTTPRoundTrip *RoundTrip `json:"http_round_trip,omitempty"`
	BusRequest    *RoundTrip `json:"bus_request,omitempty"`
}

const rawStream = "BENCH_RAW"

// stallWait is how long an async publish waits for room in a full window
// before it fails. nats.go's 200 ms default failed a full bench now and then
// with --fsync always, when one fsync held every ack for longer: the bench
// measures such a wait, it does not stop on it.
const stallWait = 30 * time.Second

// measureRaw measures appends with the expected-last-subject-sequence check
// (one publisher waiting for each ack, and an async window of concurrency
// publishes over as many subjects as the pipeline has sandboxes), an
// ordered-consumer read of what was written, and KV puts.
func measureRaw(ctx context.Context, nc *nats.Conn, subjects, concurrency int, d time.Duration) (Raw, error) {
	var r Raw
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(concurrency))
	if err != nil {
		return r, err
	}
	_ = js.DeleteStream(ctx, rawStream)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: rawStream, Subjects: []string{"bench.raw.>"}, Storage: jetstream.FileStorage}); err != nil {
		return r, fmt.Errorf("raw stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), rawStream) }()
	body := make([]byte, 300) // about the size of an envelope
	for i := range body {
		body[i] = 'x'
	}
	last := make([]uint64, subjects)
	subj := func(i int) string { return "bench.raw." + strconv.Itoa(i) }

	// Sync: one publisher, one ack at a time.
	n, start := 0, time.Now()
	for time.Since(start) < d {
		i := n % subjects
		ack, err := js.Publish(ctx, subj(i), body, jetstream.WithExpectLastSequencePerSubject(last[i]))
		if err != nil {
			return r, fmt.Errorf("raw sync append: %w", err)
		}
		last[i] = ack.Sequence
		n++
	}
	r.AppendCheckSyncEPS = float64(n) / time.Since(start).Seconds()
	r.Messages += n

	// Async: a window of concurrency appends in flight.
	n, eps, err := appendAsync(ctx, js, "bench.raw.", last, body, d, nil)
	if err != nil {
		return r, fmt.Errorf("raw async append: %w", err)
	}
	r.AppendCheckAsyncEPS = eps
	r.Messages += n

	if r.BusFloorEPS, err = busFloor(ctx, nc, subjects, concurrency, d); err != nil {
		return r, err
	}

	if r.OrderedReadEPS, err = orderedRead(ctx, js, rawStream); err != nil {
		return r, err
	}

	// KV puts: concurrency writers, each waiting for its ack.
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_raw_kv", Storage: jetstream.FileStorage})
	if err != nil {
		return r, fmt.Errorf("raw kv: %w", err)
	}
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), "bench_raw_kv") }()
	keys := max(1, subjects/concurrency) // each writer's own
	puts, err := clientsLoop(concurrency, d, func(w, i int) error {
		_, err := kv.Put(ctx, fmt.Sprintf("k%d_%d", w, i%keys), body)
		return err
	})
	if err != nil {
		return r, fmt.Errorf("raw kv put: %w", err)
	}
	r.KVPutEPS = puts.PerS
	return r, nil
}

// orderedRead reads a whole stream with an ordered consumer, decoding
// nothing, and returns messages per second.
func orderedRead(ctx context.Context, js jetstream.JetStream, stream string) (float64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	total := s.CachedInfo().State.Msgs
	if total == 0 {
		return 0, nil
	}
	start := time.Now()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, fmt.Errorf("ordered read: %w", err)
	}
	it, err := c.Messages(jetstream.PullMaxMessages(4096))
	if err != nil {
		return 0, fmt.Errorf("ordered read: %w", err)
	}
	defer it.Stop()
	var n uint64
	for n < total {
		if _, err := it.Next(); err != nil {
			return 0, fmt.Errorf("ordered read after %d of %d: %w", n, total, err)
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// rawAppendLatency offers rate appends per second with the check for d, each
// waiting for its ack, over subjects subjects, and measures each from send to
// ack: the latency of one hop of the pipeline on this server.
func rawAppendLatency(ctx context.Context, nc *nats.Conn, subjects int, rate float64, d time.Duration) (Latency, error) {
	res := Latency{OfferedPerS: rate}
	js, err := jetstream.New(nc)
	if err != nil {
		return res, err
	}
	const stream = "BENCH_RAW_LATENCY"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"bench.latency.>"}, Storage: jetstream.FileStorage}); err != nil {
		return res, fmt.Errorf("raw latency stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	body := make([]byte, 300)
	var (
		mu   sync.Mutex
		lats []time.Duration
		ferr error
		wg   sync.WaitGroup
		last = make([]uint64, subjects)
		busy = make([]bool, subjects)
	)
	start := time.Now()
	offered, skipped, oerr := offer(ctx, rate, d, func(n int) bool {
		i := n % subjects
		mu.Lock()
		if busy[i] {
			mu.Unlock()
			return false
		}
		busy[i] = true
		expect := last[i]
		mu.Unlock()
		wg.Go(func() {
			t0 := time.Now()
			ack, err := js.Publish(ctx, "bench.latency."+strconv.Itoa(i), body, jetstream.WithExpectLastSequencePerSubject(expect))
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			busy[i] = false
			if err != nil {
				ferr = errors.Join(ferr, err)
				return
			}
			last[i] = ack.Sequence
			lats = append(lats, lat)
		})
		return true
	})
	wg.Wait()
	res.Offered, res.Skipped = offered, skipped
	if oerr != nil {
		return res, oerr
	}
	res.AchievedPerS = float64(len(lats)) / time.Since(start).Seconds()
	res.Percentiles = percentilesOf(lats)
	return res, ferr
}

// busFloor runs the async append of measureRaw with the bus work the pipeline
// does per event on top: a KV put for every second event (the view writes
// about that often), one ordered consumer reading every event (the reading
// the sagas and the view share), and a KV watch on another connection (the
// bench's clients watching the view). No commands, reports, decoding or state machine: what
// the substrate alone allows the pipeline at most.
func busFloor(ctx context.Context, nc *nats.Conn, subjects, concurrency int, d time.Duration) (float64, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(concurrency))
	if err != nil {
		return 0, err
	}
	const stream, bucket = "BENCH_FLOOR", "bench_floor"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"bench.floor.>"}, Storage: jetstream.FileStorage}); err != nil {
		return 0, fmt.Errorf("bus floor stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		return 0, fmt.Errorf("bus floor bucket: %w", err)
	}
	defer func() { _ = js.DeleteKeyValue(context.WithoutCancel(ctx), bucket) }()

	watcher, err := connectAgain(nc)
	if err != nil {
		return 0, err
	}
	defer watcher.Close()
	wjs, err := jetstream.New(watcher)
	if err != nil {
		return 0, err
	}
	wkv, err := wjs.KeyValue(ctx, bucket)
	if err != nil {
		return 0, err
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	w, err := wkv.WatchAll(rctx, jetstream.UpdatesOnly())
	if err != nil {
		return 0, err
	}
	defer func() { _ = w.Stop() }()
	go func() {
		for range w.Updates() {
		}
	}()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, err
	}
	it, err := c.Messages()
	if err != nil {
		return 0, err
	}
	defer it.Stop()
	go func() {
		for {
			if _, err := it.Next(); err != nil {
				return
			}
		}
	}()

	_, eps, err := appendAsync(ctx, js, "bench.floor.", make([]uint64, subjects), body300, d, func(n, i int) error {
		if n%2 != 0 {
			return nil
		}
		_, err := js.PublishAsync("$KV."+bucket+".k"+strconv.Itoa(i), body300, jetstream.WithStallWait(stallWait))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("bus floor: %w", err)
	}
	return eps, nil
}

// body300 is a message body of about an envelope's size.
var body300 = make([]byte, 300)

// appendAsync keeps appends with the check in flight for d, round robin over
// the subjects prefix0 … prefix<len(last)-1>, as many at once as js's async
// window allows: each subject's next append expects the sequence its
// previous one got, kept in last. each, if not nil, runs after the n-th
// append (to subject i) is sent. It returns the appends sent and their
// rate, counted once every one is acknowledged.
func appendAsync(ctx context.Context, js jetstream.JetStream, prefix string, last []uint64, body []byte, d time.Duration, each func(n, i int) error) (int, float64, error) {
	futs := make([]jetstream.PubAckFuture, len(last))
	n, start := 0, time.Now()
	for time.Since(start) < d {
		i := n % len(last)
		if f := futs[i]; f != nil {
			select {
			case ack := <-f.Ok():
				last[i] = ack.Sequence
			case err := <-f.Err():
				return n, 0, err
			case <-ctx.Done():
				return n, 0, ctx.Err()
			}
		}
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: prefix + strconv.Itoa(i), Data: body}, jetstream.WithExpectLastSequencePerSubject(last[i]), jetstream.WithStallWait(stallWait))
		if err != nil {
			return n, 0, err
		}
		futs[i] = f
		if each != nil {
			if err := each(n, i); err != nil {
				return n, 0, err
			}
		}
		n++
	}
	if err := asyncComplete(ctx, js, 30*time.Second); err != nil {
		return n, 0, err
	}
	for i, f := range futs {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			last[i] = ack.Sequence
		case err := <-f.Err():
			return n, 0, err
		}
	}
	return n, float64(n) / time.Since(start).Seconds(), nil
}

// asyncComplete waits up to d for every async publish of js to be answered.
func asyncComplete(ctx context.Context, js jetstream.JetStream, d time.Duration) error {
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-time.After(d):
		return fmt.Errorf("acks not complete in %s", d)
	case <-ctx.Done():
		return ctx.Err()
	}
}
