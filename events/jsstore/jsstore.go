// Package jsstore is the event store on NATS JetStream: one stream holds the
// whole log, one subject per sandbox (torpor.sandbox.<id>), appends guarded by
// the expected last sequence of that subject and deduplicated by message id,
// ordered consumers for followers, whose positions live in a KV bucket.
package jsstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/natserr"
)

// SubjectPrefix starts the subject of every sandbox.
const SubjectPrefix = "torpor.sandbox."

// HeaderType carries the event type of each message, so consumers can filter
// without decoding the body.
const HeaderType = "Torpor-Event-Type"

// Defaults of Config.
const (
	DefaultStream          = "TORPOR_EVENTS"
	DefaultReplicas        = 1
	DefaultDuplicateWindow = 2 * time.Minute
	// DefaultMaxBytes bounds the log's storage (serve --max-log-bytes).
	DefaultMaxBytes = 4 << 30
)

// Subject is the subject of sandbox id's events.
func Subject(id string) string { return SubjectPrefix + id }

// Config says which stream holds the log and how it is kept. The zero value
// means every default.
type Config struct {
	// Stream is the stream name; default TORPOR_EVENTS.
	Stream string
	// Replicas is the replication factor of the stream and of the
	// positions bucket; default 1.
	Replicas int
	// Storage is file (the zero value, and the default) or memory.
	Storage jetstream.StorageType
	// DuplicateWindow is how long message ids are remembered for
	// deduplication; default 2m.
	DuplicateWindow time.Duration
	// MaxBytes bounds the stream's storage; default DefaultMaxBytes, -1
	// for no bound. The log is the only truth, so it is never trimmed: a
	// full log refuses new events (DiscardNew), and an append then answers
	// RESOURCE_EXHAUSTED.
	MaxBytes int64
	// OnForeign, if set, hears of each foreign message the store skips
	// (once per message, however often it is read), for the log and the
	// metrics.
	OnForeign func(Foreign)
	// OnBadPosition, if set, hears of a follower's position that holds
	// something else than a sequence (the bucket is on the bus): the
	// follower starts from 0 instead, which is safe (followers apply
	// idempotently), and this says so, for the log.
	OnBadPosition func(name string, err error)
	// GroupCommit makes appends in flight at once share one write to the
	// log (Append, group commit): for a server that syncs every write
	// (serve --fsync always), where it saves syncs; with the server's
	// interval sync each append goes on its own, as without it.
	GroupCommit bool
}

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	return c
}

// Validate reports the first invalid field of c with its defaults applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case strings.ContainsAny(c.Stream, ".*> \t\r\n/\\"):
		return fmt.Errorf("stream name %q: no dots, wildcards, slashes or spaces", c.Stream)
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("replicas %d: want 1 to 5", c.Replicas)
	case c.Storage != jetstream.FileStorage && c.Storage != jetstream.MemoryStorage:
		return fmt.Errorf("storage %v: want file or memory", c.Storage)
	case c.DuplicateWindow < 0:
		return fmt.Errorf("duplicate window %v: want positive", c.DuplicateWindow)
	case c.MaxBytes < -1:
		return fmt.Errorf("max bytes %d: want a positive size, or -1 for no bound", c.MaxBytes)
	}
	return nil
}

// Store is the JetStream event store. It is safe for concurrent use.
type Store struct {
	js     jetstream.JetStream
	cfg    Config
	stream jetstream.Stream
	// ackPrefix is how the answer to a stored publish starts (pubAck).
	ackPrefix []byte
	foreign   foreign
	out       *outages
	group     group
	// answerTimeout is the store's answerTimeout (a test may raise it).
	answerTimeout time.Duration
}

var _ events.Store = (*Store)(nil)

// New creates the stream of cfg, or updates it to cfg, and returns a store
// on it.
func New(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("event store config: %w", err)
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:               cfg.Stream,
		Description:        "torpor event log: one subject per sandbox",
		Subjects:           []string{SubjectPrefix + ">"},
		Retention:          jetstream.LimitsPolicy,
		Discard:            jetstream.DiscardNew,
		MaxBytes:           cfg.MaxBytes,
		Storage:            cfg.Storage,
		Replicas:           cfg.Replicas,
		Duplicates:         cfg.DuplicateWindow,
		AllowDirect:        true,
		AllowAtomicPublish: true,
		DenyDelete:         true,
		DenyPurge:          true,
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	return on(js, cfg, stream), nil
}

// on is the store of cfg on stream.
func on(js jetstream.JetStream, cfg Config, stream jetstream.Stream) *Store {
	s := &Store{js: js, cfg: cfg, stream: stream, ackPrefix: []byte(`{"stream":"` + cfg.Stream + `","seq":`), out: newOutages(), answerTimeout: answerTimeout}
	s.watchConn(js.Conn())
	s.watchLeader(js.Conn())
	s.foreign.report = cfg.OnForeign
	return s
}

// Bind returns a store on the existing stream named stream (default
// TORPOR_EVENTS) as its owner set it up. New would update the stream to its
// Config (its duplicate window, say); a tool beside the service, which reads
// the log or imports into it, must change nothing. The positions bucket gets
// the stream's replicas.
func Bind(ctx context.Context, js jetstream.JetStream, stream string) (*Store, error) {
	cfg := Config{Stream: stream}.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("event store config: %w", err)
	}
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Stream, err)
	}
	info := s.CachedInfo().Config
	cfg.Replicas, cfg.Storage, cfg.DuplicateWindow, cfg.MaxBytes = info.Replicas, info.Storage, info.Duplicates, info.MaxBytes
	return on(js, cfg, s), nil
}

// Stream is the stream that holds the log.
func (s *Store) Stream() jetstream.Stream { return s.stream }

// LastSeq is the sequence of the newest event in the log.
func (s *Store) LastSeq(ctx context.Context) (uint64, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("last seq: %w", natserr.Unavailable(err))
	}
	return info.State.LastSeq, nil
}
