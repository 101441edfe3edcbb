// Package kvview keeps the phase view of every sandbox in the NATS KV bucket
// torpor_phases (CONTRACT §4, §6): key the sandbox id, value the JSON of
// events.View; its checkpoint is kept beside the sagas' positions. It is both
// the projection that writes the bucket and the reader the gateway serves
// get, list, wait, watch and phase counts from.
package kvview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
	"github.com/torpor/torpor/internal/metrics"
	"github.com/torpor/torpor/projections"
)

// Config says where the view lives.
type Config struct {
	// Bucket is the KV bucket; default torpor_phases.
	Bucket string
	// Replicas of the bucket's stream; default 1.
	Replicas int
	// CacheSize bounds the views the writer keeps in memory; default 100000.
	CacheSize int
	// CheckpointEvery is how often the checkpoint is written: zero means
	// after every batch; a duration means at most once per that duration,
	// the rest written by Flush when the writer stops. The views are always
	// written first, so the checkpoint is never ahead of them; after a crash
	// it may be behind by up to CheckpointEvery, which only makes the
	// restarted runner report a little lag until the next event.
	CheckpointEvery time.Duration
	// HoldTransient is how long the writer may hold back a view whose new
	// phase is transient (provisioning, starting, stopping, suspending,
	// deleting) in case the outcome follows: then one write stores both.
	// A sandbox's events usually come in runs (suspend_requested, then
	// suspended as soon as the driver answers), so this saves most of the
	// writes, and the fsyncs with --fsync=always (the figures are in the
	// README, Choices: "Reads"), without delaying an outcome: a view in a
	// settled phase is written at once, with whatever was held for it.
	// Readers see a transient phase up to this much later, or not at all
	// when the outcome came first. Zero writes every view at once.
	HoldTransient time.Duration
	// AckTimeout bounds the wait for one write's acknowledgement, once those
	// before it are acknowledged, and for the answer of one read of the
	// writer's; default DefaultAckTimeout.
	AckTimeout time.Duration
	// MaxBytes bounds the bucket's storage; default DefaultMaxBytes. A full
	// bucket refuses writes (the projection retries; /readyz shows the lag).
	MaxBytes int64
	// TTL, when set, expires the bucket's values that long after their
	// write: what a rebuild leaves for audit (<bucket>_at_<seq>) or behind a
	// crash (<bucket>_rebuild_<n>) goes, and Reap removes the bucket.
	TTL time.Duration
	// PastTTL is the TTL of the buckets a rebuild makes (views of the
	// past, and the new bucket of a swap); default DefaultPastTTL.
	PastTTL time.Duration
	// Log, when set, is the event log the writer rebuilds a sandbox's view
	// from when the bucket holds garbage under its key (ErrGarbage);
	// without it such a view is folded anew from its next event.
	Log Loader
	// AsyncPersist makes a new bucket with JetStream's asynchronous
	// persistence (persist.go): its writes are not synced one by one, and
	// its checkpoint is stamped so that New can tell, after a crash, that
	// the bucket lost writes the checkpoint covers, and set it back. An
	// existing bucket keeps the persistence it was made with (Async says
	// which). Only for a bucket of one replica on a server that crashes
	// with this process (the embedded one).
	AsyncPersist bool
	// Metrics counts the phase changes the view folds in as it applies
	// the log (each once per process, however often it is folded again);
	// nil counts nothing. Only the live view has it: a rebuild's view is
	// made without.
	Metrics *metrics.Set
}

// Loader reads one sandbox's events (events.Store satisfies it).
type Loader interface {
	Load(ctx context.Context, id string, after uint64) ([]events.Envelope, error)
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Replicas < 0 || c.Replicas > 5:
		return fmt.Errorf("replicas %d: want 1 to 5", c.Replicas)
	case c.CacheSize < 0:
		return fmt.Errorf("cache size %d: must not be negative", c.CacheSize)
	case c.CheckpointEvery < 0:
		return fmt.Errorf("checkpoint every %s: must not be negative", c.CheckpointEvery)
	case c.AckTimeout < 0:
		return fmt.Errorf("ack timeout %s: must not be negative", c.AckTimeout)
	case c.HoldTransient < 0:
		return fmt.Errorf("hold transient %s: must not be negative", c.HoldTransient)
	case c.Bucket != "" && !validKey(c.Bucket):
		return fmt.Errorf("bucket %q: not a valid bucket name", c.Bucket)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Bucket == "" {
		c.Bucket = "torpor_phases"
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.CacheSize == 0 {
		c.CacheSize = 100000
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.PastTTL == 0 {
		c.PastTTL = DefaultPastTTL
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	return c
}

// Storage bounds of a view's bucket (the README's "Limits" table): the
// server reserves MaxBytes for each bucket, the live one and each rebuilt
// one, so replays in a loop run out of reservation rather than disk.
const (
	DefaultMaxBytes = 1 << 30
	MaxValueSize    = 256 << 10
)

// View is the phase view in a KV bucket. Apply is meant for one writer (the
// projection runner); the readers are safe for any number of goroutines.
type View struct {
	kv  jetstream.KeyValue
	js  jetstream.JetStream
	cfg Config
	pre string // subject prefix of the bucket's keys: $KV.<bucket>.
	// pos is the positions bucket, where the checkpoint is kept under
	// cpKey (see checkpoint.go).
	pos   jetstream.KeyValue
	cpKey string
	// async: the bucket's persist mode is async (persist.go); recovered
	// says what New found when it set the checkpoint back.
	async     bool
	recovered string

	wmu sync.Mutex // one writer at a time: ApplyBatch, Flush, the hold timer
	cp  checkpoint // the writer's copy of the checkpoint; wmu held
	// applied is the highest seq applied (written or held) and savedAt when
	// the checkpoint was last written (CheckpointEvery); wmu held.
	applied uint64
	savedAt time.Time
	// counted is the highest seq whose phase change is counted
	// (Config.Metrics); wmu held.
	counted uint64
	// held are the sandboxes whose events are folded but not written yet
	// (HoldTransient), and timer writes them when their time is up; wmu
	// held.
	held  map[string]group
	timer *time.Timer

	mu    sync.Mutex
	cache map[string]packed // id → the last view written and its revision

	garbage atomic.Uint64 // values found that are no view (Garbage)
}

// entry is a view as the writer last stored it under revision rev.
type entry struct {
	view events.View
	rev  uint64
}

// New creates the bucket, or binds to it when it exists, and the positions
// bucket its checkpoint goes to; it moves a checkpoint an older build kept
// in the view's bucket over there.
func New(ctx context.Context, js jetstream.JetStream, cfg Config) (*View, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kv view: %w", err)
	}
	cfg = cfg.withDefaults()
	kv, async, err := openBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:       cfg.Bucket,
		Description:  "torpor phase view: sandbox id → view",
		History:      1,
		Replicas:     cfg.Replicas,
		Storage:      jetstream.FileStorage,
		MaxBytes:     cfg.MaxBytes,
		MaxValueSize: MaxValueSize,
		TTL:          cfg.TTL,
	}, cfg.AsyncPersist)
	if err != nil {
		return nil, fmt.Errorf("kv view: bucket %s: %w", cfg.Bucket, err)
	}
	pos, err := positions(ctx, js, cfg.Replicas)
	if err != nil {
		return nil, fmt.Errorf("kv view: bucket %s: %w", events.PositionBucket, err)
	}
	v := &View{kv: kv, js: js, cfg: cfg, pre: keyPrefix(js, cfg.Bucket), pos: pos, cpKey: checkpointKey(cfg.Bucket), async: async,
		cache: make(map[string]packed), held: map[string]group{}}
	if err := v.forgetStale(ctx); err != nil {
		return nil, fmt.Errorf("kv view: %w", err)
	}
	if err := v.migrate(ctx); err != nil {
		return nil, fmt.Errorf("kv view: %w", err)
	}
	if v.async {
		if err := v.recover(ctx); err != nil {
			return nil, fmt.Errorf("kv view: %w", err)
		}
	}
	return v, nil
}

// Name is the projection's name, in the runner's logs and errors.
func (v *View) Name() string { return "kvview" }

// Get returns the view of sandbox id, or an error wrapping events.ErrNotFound.
func (v *View) Get(ctx context.Context, id string) (events.View, error) {
	view, _, err := v.load(ctx, id)
	if err != nil {
		return events.View{}, err
	}
	return view, nil
}

// load reads the view of id and its revision from the bucket, waiting at
// most AckTimeout for the answer: a read whose server died under it is
// never answered, and the hold timer's reads ran under a 30 s context (the
// whole write's), so the writer held its lock, and the view stood still,
// for 30 s after a NATS server was killed (TestNATSServerProcesses in CI).
func (v *View) load(ctx context.Context, id string) (events.View, uint64, error) {
	if !viewKey(id) {
		return events.View{}, 0, fmt.Errorf("sandbox %q: %w", id, events.ErrNotFound)
	}
	ctx, cancel := context.WithTimeout(ctx, v.cfg.AckTimeout)
	defer cancel()
	e, err := v.kv.Get(ctx, id)
	if err != nil && ctx.Err() != nil {
		err = natserr.Unavailable(err)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return events.View{}, 0, fmt.Errorf("sandbox %s: %w", id, events.ErrNotFound)
	case err != nil:
		return events.View{}, 0, fmt.Errorf("get %s: %w", id, err)
	}
	view, err := decode(e)
	if err != nil {
		v.garbage.Add(1)
		return events.View{}, e.Revision(), err
	}
	return view, e.Revision(), nil
}

// ErrGarbage marks a value of the bucket that is no view of its key:
// written by something else than the view's writer (the bucket is on the
// bus), or damaged. Readers skip it and count it (Garbage); a Get of it is
// UNAVAILABLE; the writer rebuilds the view from the log at the sandbox's
// next event (Config.Log), else takes it as no view.
var ErrGarbage = errors.New("not a view")

// decode reads e as the view of its key, or an error wrapping ErrGarbage.
func decode(e jetstream.KeyValueEntry) (events.View, error) {
	return decodeView(e.Key(), e.Value(), e.Revision())
}

// decodeView reads raw, the value of key at revision rev, as the view of
// key, or an error wrapping ErrGarbage.
func decodeView(key string, raw []byte, rev uint64) (events.View, error) {
	var view events.View
	err := json.Unmarshal(raw, &view)
	switch {
	case err != nil:
	case view.ID != key:
		err = fmt.Errorf("the view of %q", view.ID)
	case view.Seq == 0 || !view.Phase.Known():
		err = fmt.Errorf("seq %d, phase %q", view.Seq, view.Phase)
	}
	if err != nil {
		return events.View{}, events.Errorf(events.CodeUnavailable, "view %s rev %d: %v; it is rebuilt from the log at its next event: %w", key, rev, err, ErrGarbage)
	}
	return view, nil
}

// Garbage is how many times a reader or the writer found a value in the
// bucket that is no view (ErrGarbage) and passed over it.
func (v *View) Garbage() uint64 { return v.garbage.Load() }

// keyPrefix is the subject prefix under which js publishes the keys of
// bucket, as the KeyValue API's Put does: $KV.<bucket>., behind the API
// prefix of a domain or an import when js has one.
func keyPrefix(js jetstream.JetStream, bucket string) string {
	pre := "$KV." + bucket + "."
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API." + pre
	case o.APIPrefix != "" && o.APIPrefix != jetstream.DefaultAPIPrefix:
		if o.APIPrefix[len(o.APIPrefix)-1] != '.' {
			return o.APIPrefix + "." + pre
		}
		return o.APIPrefix + pre
	}
	return pre
}

// viewKey reports whether key can hold a view: a valid key without dots.
// A sandbox id has none (events.CheckAppend refuses them), so a key with
// dots is never a view: readers skip them all, the checkpoint an older build
// kept in the bucket (legacyKey) among them, rather than that one key by
// name.
func viewKey(key string) bool { return projections.ViewID(key) }

// validKey reports whether s can be a KV key without being a wildcard
// (projections.KeyName).
func validKey(s string) bool { return projections.KeyName(s) }
