package gateway

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/internal/metrics"
	"github.com/torpor/torpor/services/compute"
)

// Drivers is what the gateway asks of the compute side before it accepts a
// command (compute.Registry satisfies it).
type Drivers interface {
	Validate(name string, spec compute.Spec) error
	Capabilities(name string, opts map[string]string) (compute.Capabilities, error)
	// Names lists the drivers (GET /v1/drivers).
	Names() []string
	// Logs is the last tail lines of a sandbox's workload output, or an
	// error wrapping compute.ErrUnimplemented when its driver keeps none.
	Logs(ctx context.Context, name string, spec compute.Spec, tail int) ([]byte, error)
	// Dial connects to a port of a sandbox's workload (forwards), or
	// answers an error wrapping compute.ErrUnimplemented.
	Dial(ctx context.Context, name string, spec compute.Spec, port int) (net.Conn, error)
}

// Names reserves sandbox names, which must be unique among sandboxes that are
// not deleted; no single subject can guard that.
type Names interface {
	// Reserve claims name for id; if another sandbox holds it, it returns
	// that holder and an error wrapping ErrNameTaken.
	Reserve(ctx context.Context, name, id string) (Holder, error)
	// Take claims name for id from holder (a deleted sandbox, or one that
	// was never created).
	Take(ctx context.Context, name, holder, id string) error
	// Release frees name if id holds it.
	Release(ctx context.Context, name, id string) error
	// Lookup returns the id holding name, or an error wrapping events.ErrNotFound.
	Lookup(ctx context.Context, name string) (string, error)
	// Claim maps an idempotency key of a create to id, once; it returns the id
	// the key is already mapped to, if any.
	Claim(ctx context.Context, key, id string) (string, error)
}

// ErrNameTaken: the name is held by another sandbox.
var ErrNameTaken = errors.New("name in use")

// Holder is who holds a name, and since when.
type Holder struct {
	ID    string
	Since time.Time
}

// Config tunes the command service.
type Config struct {
	// Node is the node new sandboxes belong to.
	Node string
	// Nodes are the other nodes this service drives (their drivers on the
	// bus): a create or a resume may name one.
	Nodes []string
	// DefaultDriver is the driver of a create that names none.
	DefaultDriver string
	// Retries bounds the reload-and-retry loop on a concurrent change.
	Retries int
	// CacheSize bounds the sandboxes whose folded state is kept in memory.
	CacheSize int
	// MaxBody bounds a command's body, in bytes.
	MaxBody int64
	// NameGrace is how long a name reserved for a sandbox that has no
	// events stays reserved: a create reserves the name, then appends, and
	// a crash (or the log unreachable) between the two would keep the name
	// for ever. Past it, a create of the same name takes it over. It must
	// outlast a create's append (CreateTimeout bounds that).
	NameGrace time.Duration
	// CreateTimeout bounds a create from its name's reservation to its
	// append's answer.
	CreateTimeout time.Duration
	// HeartbeatLimit is how long a supervisor that heartbeats may fall
	// silent before it is recorded detached (default 15s: three of
	// torpor supervise's beats).
	HeartbeatLimit time.Duration
	// Unavailable, when set, is how long since a time this process found
	// the log unavailable (jsstore.Store.Unavailable): the heartbeat limit
	// is extended by it.
	Unavailable func(since time.Time) time.Duration
	// ReportHold is how long a supervisor's report that comes before the
	// runner recorded its generation's resume (see awaits) waits at the
	// gateway for that record before it is answered ABORTED, which the
	// supervisor takes for "ask again" (default 1s, under a supervisor's
	// 2 s request timeout).
	ReportHold time.Duration
	// Metrics records the commands, appends and fenced reports; nil
	// records nothing.
	Metrics *metrics.Set
	// Limits bound what one request may ask (zero fields: the defaults).
	Limits Limits
	// ServiceInbox, when set (a bus with accounts: busauth.ServiceInbox),
	// is the inbox every command from torpor's own account must be
	// answered on; one answered elsewhere is PERMISSION_DENIED.
	ServiceInbox string
	// RetainFor is how long a retained state is held from its suspension
	// for a create that names no retain_for; zero keeps it for ever.
	RetainFor time.Duration
	// ActivityWindow is the activity window (serve --activity-window,
	// default 30s): a sandbox.active is appended at most once per window
	// per sandbox; activity within the window of the last one recorded is
	// no new event (README "Activity").
	ActivityWindow time.Duration
	// Idle is the idle policy of a create that names none (serve
	// --idle-after, --idle-action, --idle-fallback); zero for none.
	Idle events.IdlePolicy
}

// DefaultActivityWindow is Config.ActivityWindow's default.
const DefaultActivityWindow = 30 * time.Second

// Defaults fills zero fields.
func (c *Config) Defaults() {
	if c.Node == "" {
		c.Node = "local"
	}
	if c.DefaultDriver == "" {
		c.DefaultDriver = "sim"
	}
	if c.Retries == 0 {
		c.Retries = 8
	}
	if c.CacheSize == 0 {
		c.CacheSize = 100_000
	}
	if c.MaxBody == 0 {
		c.MaxBody = 256 << 10
	}
	if c.CreateTimeout == 0 {
		c.CreateTimeout = 10 * time.Second
	}
	if c.NameGrace == 0 {
		c.NameGrace = 6 * c.CreateTimeout
	}
	if c.HeartbeatLimit == 0 {
		c.HeartbeatLimit = 15 * time.Second
	}
	if c.ReportHold == 0 {
		c.ReportHold = time.Second
	}
	if c.ActivityWindow == 0 {
		c.ActivityWindow = DefaultActivityWindow
	}
	c.Limits.defaults()
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Retries < 1:
		return fmt.Errorf("gateway: retries %d, want 1 or more", c.Retries)
	case c.CacheSize < 1:
		return fmt.Errorf("gateway: cache size %d, want 1 or more", c.CacheSize)
	case c.MaxBody < 1024:
		return fmt.Errorf("gateway: max body %d bytes, want 1024 or more", c.MaxBody)
	case c.CreateTimeout <= 0:
		return fmt.Errorf("gateway: create timeout %s, want a positive duration", c.CreateTimeout)
	case c.HeartbeatLimit <= 0:
		return fmt.Errorf("gateway: heartbeat limit %s, want a positive duration", c.HeartbeatLimit)
	case c.RetainFor < 0:
		return fmt.Errorf("gateway: retain for %s, want a positive duration or none", c.RetainFor)
	case c.ReportHold < 0:
		return fmt.Errorf("gateway: report hold %s, want a positive duration", c.ReportHold)
	case c.ActivityWindow < 0:
		return fmt.Errorf("gateway: activity window %s, want a positive duration", c.ActivityWindow)
	case c.NameGrace < 2*c.CreateTimeout:
		return fmt.Errorf("gateway: name grace %s, want at least twice the create timeout %s", c.NameGrace, c.CreateTimeout)
	case !validName.MatchString(c.Node):
		return fmt.Errorf("gateway: node name %q: want lower-case letters, digits, '-', '_' or '.'", c.Node)
	}
	if err := c.Limits.validate(); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if !validName.MatchString(n) || n == c.Node {
			return fmt.Errorf("gateway: other node %q: want a node name other than the service's own %q", n, c.Node)
		}
	}
	return nil
}

// node checks that n names a node this service drives, for a command's
// field (INVALID_ARGUMENT otherwise).
func (c Config) node(field, n string) error {
	if n == c.Node || slices.Contains(c.Nodes, n) {
		return nil
	}
	return events.Errorf(events.CodeInvalidArgument, "%s %q: unknown node (this service drives %s)", field, n, strings.Join(append([]string{c.Node}, c.Nodes...), ", "))
}

// Service is the command service: load, decide, append, retry on conflict.
type Service struct {
	store   events.Store
	names   Names
	drivers Drivers
	creds   *compute.Credentials
	cfg     Config
	log     zerolog.Logger
	now     func() time.Time

	locks [4096]fifoLock // striped by sandbox id
	mu    sync.Mutex
	cache map[string]*Sandbox
	// moved is closed (and dropped) whenever a state is cached: it wakes
	// the reports waiting for a record (waitMove).
	moved   chan struct{}
	refused refusedLog
	// reportsRefused counts supervisor reports refused (ReportsRefused).
	reportsRefused atomic.Uint64
}

// refusedLog counts the stored events the aggregate passed over and logs
// each once (while it is among the last few thousand).
type refusedLog struct {
	n    atomic.Uint64
	mu   sync.Mutex
	seen map[uint64]bool
}

func (r *refusedLog) note(env events.Envelope, err error, log zerolog.Logger) {
	r.mu.Lock()
	if r.seen[env.Seq] {
		r.mu.Unlock()
		return
	}
	if r.seen == nil || len(r.seen) >= 4096 {
		r.seen = map[uint64]bool{}
	}
	r.seen[env.Seq] = true
	r.mu.Unlock()
	r.n.Add(1)
	log.Error().Err(err).Str("sandbox_id", env.SandboxID).Str("event_type", env.Type).Uint64("seq", env.Seq).
		Msg("stored event passed over: the aggregate cannot take it")
}

// PassedOver is how many stored events the aggregate could not take and
// passed over (each counted once).
func (s *Service) PassedOver() uint64 { return s.refused.n.Load() }

// NewService returns a command service over store.
func NewService(store events.Store, names Names, drivers Drivers, creds *compute.Credentials, cfg Config, log zerolog.Logger) (*Service, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	svc := &Service{
		store: store, names: names, drivers: drivers, creds: creds, cfg: cfg, log: log,
		now: time.Now, cache: make(map[string]*Sandbox),
	}
	for i := range svc.locks {
		svc.locks[i] = newFIFOLock()
	}
	return svc, nil
}

var (
	nameRule   = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)
	idempotent = uuid.MustParse("0193b0a4-7c1e-7a4e-9d0e-5f1f0c9e2a11")
	// validName is the name rule: 1 to 63 of a-z 0-9 . _ -, alphanumeric
	// at both ends, and no two dots in a row, since a name is a key of
	// the bucket torpor_names, whose subject tokens cannot be empty (the
	// server refuses such a key, which was a 500).
	validName = nameMatcher{}
)

type nameMatcher struct{}

func (nameMatcher) MatchString(s string) bool {
	return nameRule.MatchString(s) && !strings.Contains(s, "..")
}

// ParseID checks that id is a sandbox id (a uuid), so it is safe in a subject.
func ParseID(id string) error {
	if !events.ValidID(id) {
		return events.Errorf(events.CodeInvalidArgument, "invalid sandbox id %q: want a lower-case uuid", id)
	}
	return nil
}

// CommandID is the id of a command: derived from the idempotency key when
// there is one, so that a retry is recognised, else fresh.
func CommandID(verb, id, key string) string {
	if key == "" {
		return uuid.Must(uuid.NewV7()).String()
	}
	return uuid.NewSHA1(idempotent, []byte(verb+"\x00"+id+"\x00"+key)).String()
}

func (s *Service) lock(id string) func() {
	h := fnv.New32a()
	h.Write([]byte(id))
	m := s.locks[h.Sum32()%uint32(len(s.locks))]
	m.Lock()
	return m.Unlock
}

// load returns the folded state of id: from the cache, else from the log.
// cached says which: a cached state may be behind the log when another
// instance appended meanwhile. The caller holds the sandbox's lock.
func (s *Service) load(ctx context.Context, id string) (sb *Sandbox, cached bool, err error) {
	s.mu.Lock()
	sb, ok := s.cache[id]
	s.mu.Unlock()
	if ok {
		return sb, true, nil
	}
	sb, err = s.fold(ctx, &Sandbox{ID: id}, 0)
	return sb, false, err
}

// fold folds the events after sb.Seq into a copy of sb, sets its Seq to at
// least head (the subject's last sequence, past foreign messages Load left
// out; 0 when unknown) and caches it.
func (s *Service) fold(ctx context.Context, sb *Sandbox, head uint64) (*Sandbox, error) {
	envs, err := s.store.Load(ctx, sb.ID, sb.Seq)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", sb.ID, err)
	}
	next := sb.clone()
	for _, env := range envs {
		if err := next.apply(env); err != nil {
			// Not written through a gateway (its data does not fit its
			// type, or the table refuses it there): like a foreign
			// message, it is passed over and changes nothing.
			s.refused.note(env, err, s.log)
			next.Seq = max(next.Seq, env.Seq)
		}
	}
	next.Seq = max(next.Seq, head)
	if next.Exists() {
		s.put(next)
	}
	return next, nil
}

// reachTries and reachBackoff bound reach's wait.
const (
	reachTries   = 100
	reachBackoff = 20 * time.Millisecond
)

// reach brings the cached state of id up to seq at least, the sequence of
// the intent a report is caused by: the state a report is judged on holds
// its cause. On a replicated stream the reader of the intent (a saga's
// consumer, on a replica) may have it before the leader, whose word the
// head is, has applied it: judged on the head, the report was fenced ("speaks
// for generation 5, current is 4") and the saga's outcome dropped, the
// sandbox left in starting (the bench's cluster row, about one run in
// five). The caller holds id's lock; seq 0 asks nothing.
func (s *Service) reach(ctx context.Context, id string, seq uint64) error {
	if seq == 0 {
		return nil
	}
	sb, _, err := s.load(ctx, id)
	if err != nil {
		return err
	}
	for try := 0; sb.Seq < seq; try++ {
		if try == reachTries {
			return events.Errorf(events.CodeUnavailable, "sandbox %s: the log's head is at %d, short of %d, which caused the report", id, sb.Seq, seq)
		}
		if try > 0 {
			select {
			case <-ctx.Done():
				return events.Errorf(events.CodeUnavailable, "sandbox %s: %v", id, ctx.Err())
			case <-time.After(reachBackoff):
			}
		}
		if sb, err = s.refresh(ctx, sb); err != nil {
			return err
		}
	}
	return nil
}

// refresh brings sb up to the subject's head: one direct get of the last
// sequence, then, if the log moved, the events after sb.Seq. A state it
// returns decides as the log stands now.
func (s *Service) refresh(ctx context.Context, sb *Sandbox) (*Sandbox, error) {
	head, err := s.store.Head(ctx, sb.ID)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", sb.ID, err)
	}
	if head == sb.Seq {
		return sb, nil
	}
	return s.fold(ctx, sb, head)
}

func (s *Service) put(sb *Sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.moved != nil {
		close(s.moved)
		s.moved = nil
	}
	cur, ok := s.cache[sb.ID]
	if ok && cur.Seq > sb.Seq {
		// A fold that read the log before a concurrent append (a read
		// outside the sandbox's lock) finishes after it: the cache never
		// goes back in seq.
		return
	}
	if !ok && len(s.cache) >= s.cfg.CacheSize {
		for k := range s.cache { // evict one at random
			delete(s.cache, k)
			break
		}
	}
	s.cache[sb.ID] = sb
}

func (s *Service) forget(id string) {
	s.mu.Lock()
	delete(s.cache, id)
	s.mu.Unlock()
}

func (sb *Sandbox) clone() *Sandbox {
	c := *sb
	c.pending = slices.Clone(sb.pending) // keys is shared (see note)
	return &c
}

// Sandbox returns the folded state of id, read from the log (or the cache).
func (s *Service) Sandbox(ctx context.Context, id string) (*Sandbox, error) {
	if err := ParseID(id); err != nil {
		return nil, err
	}
	defer s.lock(id)()
	sb, _, err := s.load(ctx, id)
	if err != nil {
		return nil, err
	}
	if !sb.Exists() {
		return nil, events.Errorf(events.CodeNotFound, "sandbox %s not found", id)
	}
	return sb, nil
}

// Head is the sequence of sandbox id's last event in the log, as the log
// stands now (on a replicated stream, the leader's word).
func (s *Service) Head(ctx context.Context, id string) (uint64, error) {
	return s.store.Head(ctx, id)
}

// Known says whether the service holds id's state in its cache: a
// sandbox it knows exists (its log has events), without the sandbox's lock
// or a read of the log. False says nothing; Sandbox then tells.
func (s *Service) Known(id string) bool {
	s.mu.Lock()
	_, ok := s.cache[id]
	s.mu.Unlock()
	return ok
}

// Handle runs one command and returns the view right after its events.
func (s *Service) Handle(ctx context.Context, c Command) (events.View, error) {
	start := time.Now()
	v, err := s.handle(ctx, c)
	code := metrics.OK
	if err != nil {
		code = string(events.CodeOf(err))
	}
	s.cfg.Metrics.Command(c.Verb, code, time.Since(start))
	return v, err
}

func (s *Service) handle(ctx context.Context, c Command) (events.View, error) {
	if c.Verb == VerbCreate {
		return s.create(ctx, c)
	}
	if err := ParseID(c.ID); err != nil {
		return events.View{}, err
	}
	if c.CommandID == "" {
		c.CommandID = CommandID(c.Verb, c.ID, c.IdempotencyKey)
	}
	if c.Verb == VerbTouch {
		c.Source, c.At, c.Window = events.ActiveTouch, s.now(), s.cfg.ActivityWindow
	}
	defer s.lock(c.ID)()
	meta := events.Meta{Actor: c.Actor, CommandID: c.CommandID, CorrelationID: c.CommandID}
	var active bool // the last decision appends a sandbox.active
	sb, err := s.append(ctx, c.ID, true, meta, c.CommandID, func(sb *Sandbox) ([]events.Event, error) {
		active = false
		caps, err := s.drivers.Capabilities(sb.Spec.Driver, sb.Spec.DriverOptions)
		if err != nil && sb.Exists() {
			return nil, events.Errorf(events.CodeInternal, "sandbox %s: %v", sb.ID, err)
		}
		if c.ResumeOn != "" && c.ResumeOn != sb.Spec.Node && caps.ResumeElsewhere {
			// A driver that cannot move its state says so first (decide).
			if err := s.cfg.node("resume node", c.ResumeOn); err != nil {
				return nil, err
			}
		}
		evs, err := decide(sb, c, caps)
		active = c.Verb == VerbTouch && len(evs) > 0
		return evs, err
	})
	if err != nil {
		return events.View{}, err
	}
	if active {
		s.cfg.Metrics.Active(c.Source)
	}
	return s.answer(ctx, c, sb)
}

// Active records activity of sandbox id from source (events.ActiveForward,
// events.ActiveSupervisor), seen at at, as a touch would with actor for
// the audit: a sandbox.active, unless one was recorded within the activity
// window before at (then nothing, and no error). The window is judged on
// the state this instance holds and, when that says nothing is due, again
// at the log's head, and an append meets the subject's concurrency check:
// a sandbox.active another instance appended within the window is seen, so
// the instances of one bus together append at most one per window and
// sandbox. Activity of a sandbox in a phase that takes none (deleting,
// deleted, error) is FAILED_PRECONDITION, as a touch's; an unknown sandbox
// is NOT_FOUND.
func (s *Service) Active(ctx context.Context, id, source, actor string, at time.Time) error {
	if err := ParseID(id); err != nil {
		return err
	}
	c := Command{Verb: VerbTouch, ID: id, Source: source, At: at, Window: s.cfg.ActivityWindow}
	defer s.lock(id)()
	var active bool
	_, err := s.append(ctx, id, true, events.Meta{Actor: actor}, "", func(sb *Sandbox) ([]events.Event, error) {
		evs, err := decide(sb, c, compute.Capabilities{})
		active = len(evs) > 0
		return evs, err
	})
	if err == nil && active {
		s.cfg.Metrics.Active(source)
	}
	return err
}

// Record appends events a saga or a supervisor reports about cause's sandbox,
// through the table and the generation fence. Refused events come back as
// FAILED_PRECONDITION: the sandbox has moved on. A refusal (or a report
// found recorded already) decided on the cached state is decided again on
// the state at the subject's head before it is answered: another instance
// may have moved the sandbox to where the report fits (a suspend outcome
// reaching an instance that still caches ready, say), and a report that
// saga or supervisor takes as final must not be refused on a stale cache.
func (s *Service) Record(ctx context.Context, cause events.Envelope, actor string, evs ...events.Event) error {
	if len(evs) == 1 {
		if e, ok := evs[0].(*events.IdleTimeout); ok {
			return s.idle(ctx, cause, e)
		}
	}
	return s.record(ctx, cause, actor, nil, evs...)
}

// record is Record, with gate, when set, judging the state first: an
// error it returns refuses the report as decide's would (and is judged
// again at the head when the state was cached).
func (s *Service) record(ctx context.Context, cause events.Envelope, actor string, gate func(*Sandbox) error, evs ...events.Event) error {
	if err := ParseID(cause.SandboxID); err != nil {
		return err
	}
	defer s.lock(cause.SandboxID)()
	if err := s.reach(ctx, cause.SandboxID, cause.Seq); err != nil {
		return err
	}
	sb, err := s.append(ctx, cause.SandboxID, true, cause.Caused(actor), dedupOf(cause), func(sb *Sandbox) ([]events.Event, error) {
		if gate != nil && sb.Exists() {
			if err := gate(sb); err != nil {
				return nil, err
			}
		}
		return reported(sb, evs, s.now())
	})
	if err == nil && sb.Gone() {
		if err := s.names.Release(ctx, sb.Spec.Name, sb.ID); err != nil {
			// The name stays reserved; a create of the same name takes it over.
			s.log.Warn().Err(err).Str("sandbox_id", sb.ID).Msg("release name")
		}
	}
	return err
}

// cachedSeq is the sequence of the state of id in the cache, 0 when none.
func (s *Service) cachedSeq(id string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb, ok := s.cache[id]; ok {
		return sb.Seq
	}
	return 0
}

// movedCh is a channel closed when a state is next cached (an append of
// this instance, or a read that found the log moved).
func (s *Service) movedCh() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.moved == nil {
		s.moved = make(chan struct{})
	}
	return s.moved
}

// dedupOf is what derives the message ids of the events a report caused by
// cause appends (none for a cause without an id): the same fact reported
// twice for one cause lands once.
func dedupOf(cause events.Envelope) string {
	if cause.ID == "" {
		return ""
	}
	return "r:" + cause.ID
}

// append runs decide against the current state and appends what it returns,
// stamping each event with the phase the table gives; on a concurrent change it
// reloads and decides again. dedup, when set, derives the message ids so that a
// retried command lands once. The caller holds the sandbox's lock.
func (s *Service) append(ctx context.Context, id string, verify bool, meta events.Meta, dedup string, decide func(*Sandbox) ([]events.Event, error)) (*Sandbox, error) {
	sb, _, err := s.load(ctx, id)
	if err != nil {
		return nil, err
	}
	// A state read from the log is verified as a cached one is: the read
	// of a replicated log may be served by a replica behind it (Head is
	// the leader's word).
	return s.appendFrom(ctx, sb, verify, meta, dedup, decide)
}

// appendFrom is append from the state sb, which may be stale: a stale state
// costs a conflict and a reload, never a wrong append. A decision that
// appends nothing (an idempotent repeat, a refusal by decide or by the
// table) meets no concurrency check, so when verify is set (sb came from
// the cache, and another instance may have moved the sandbox since, or
// from a read a replica behind the log may have served) it is decided
// again on the state at the subject's head before it is answered.
func (s *Service) appendFrom(ctx context.Context, sb *Sandbox, verify bool, meta events.Meta, dedup string, decide func(*Sandbox) ([]events.Event, error)) (*Sandbox, error) {
	id := sb.ID
	for attempt := 0; ; attempt++ {
		evs, err := decide(sb)
		var (
			next *Sandbox
			envs []events.Envelope
		)
		if err == nil && len(evs) > 0 {
			// The table may refuse what decide returned (a report in a
			// phase that does not take it): a refusal like decide's.
			next, envs, err = s.stamp(sb, evs, meta, dedup)
		}
		if err != nil || len(evs) == 0 {
			if !verify {
				return sb, err
			}
			verify = false
			cur, rerr := s.refresh(ctx, sb)
			if rerr != nil {
				return nil, rerr
			}
			if cur.Seq == sb.Seq {
				return sb, err
			}
			sb = cur
			continue
		}
		seq, err := s.store.Append(ctx, id, sb.Seq, envs...)
		if err == nil {
			// Stamp the stored sequence into the state and its view: the
			// events were folded without one, and a sequence moves nothing
			// else (apply and View.Fold only record the last).
			next.stamp(seq)
			s.put(next)
			return next, nil
		}
		if !errors.Is(err, events.ErrConflict) {
			return nil, fmt.Errorf("append %s: %w", id, err)
		}
		s.cfg.Metrics.AppendConflict()
		if attempt+1 >= s.cfg.Retries {
			s.forget(id)
			return nil, events.Errorf(events.CodeAborted, "sandbox %s changed concurrently %d times; retry", id, attempt+1)
		}
		if sb, err = s.refresh(ctx, sb); err != nil {
			return nil, err
		}
		s.cfg.Metrics.AppendRetry()
	}
}

// stamp folds evs into a copy of sb through the table and returns it with
// the envelopes to append, each stamped with the phase it moves the sandbox
// to; an event the table refuses in its phase is a *TransitionError.
func (s *Service) stamp(sb *Sandbox, evs []events.Event, meta events.Meta, dedup string) (*Sandbox, []events.Envelope, error) {
	next := sb.clone()
	envs := make([]events.Envelope, len(evs))
	now := s.now()
	for i, e := range evs {
		env, err := events.NewEnvelope(sb.ID, e, meta, now)
		if err != nil {
			return nil, nil, err
		}
		if dedup != "" {
			env.MsgID = dedup + ":" + e.Type()
		}
		if err := next.apply(env); err != nil {
			return nil, nil, err
		}
		env.Phase = next.Phase
		envs[i] = env
	}
	if err := s.cfg.Limits.checkSize(sb.ID, envs); err != nil {
		return nil, nil, err
	}
	return next, envs, nil
}

// create runs a create command: validate, reserve the name, append created.
func (s *Service) create(ctx context.Context, c Command) (events.View, error) {
	r := &c.Create
	if r.Driver == "" {
		r.Driver = s.cfg.DefaultDriver
	}
	node := s.cfg.Node
	if r.Node != "" {
		if err := s.cfg.node("create node", r.Node); err != nil {
			return events.View{}, err
		}
		node = r.Node
	}
	if err := s.cfg.Limits.checkCreate(r); err != nil {
		return events.View{}, err
	}
	var err error
	if c.Expiry.ExpiresAt, c.Expiry.OnExpiry, c.Expiry.RetainFor, err = events.ParseCreateExpiry(*r, s.now(), s.cfg.RetainFor); err != nil {
		return events.View{}, err
	}
	if c.Expiry.Idle, err = s.idlePolicy(r.Idle); err != nil {
		return events.View{}, err
	}
	if err := s.drivers.Validate(r.Driver, compute.Spec{Node: node, Options: r.DriverOptions, Command: r.Command, Env: r.Env}); err != nil {
		// A refusal that carries a code keeps it (a node that lacks what
		// the driver needs is FAILED_PRECONDITION); any other is the
		// request's fault.
		code := events.CodeOf(err)
		if code == events.CodeInternal {
			code = events.CodeInvalidArgument
		}
		return events.View{}, events.Errorf(code, "create: %v", err)
	}
	if r.Name != "" && !validName.MatchString(r.Name) {
		return events.View{}, events.Errorf(events.CodeInvalidArgument, "invalid name %q: 1 to 63 lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit, no two dots in a row", r.Name)
	}
	if r.Name != "" && ParseID(r.Name) == nil {
		return events.View{}, events.Errorf(events.CodeInvalidArgument, "invalid name %q: a name must not look like a sandbox id", r.Name)
	}
	id := uuid.Must(uuid.NewV7()).String()
	c.CommandID = CommandID(VerbCreate, "", c.IdempotencyKey)
	if c.IdempotencyKey != "" {
		held, err := s.names.Claim(ctx, c.CommandID, id)
		if err != nil {
			return events.View{}, fmt.Errorf("create: %w", err)
		}
		id = held
	}
	if r.Name == "" {
		r.Name = "sbx-" + id[len(id)-12:]
	}
	defer s.lock(id)()
	// From the reservation to the append's answer within CreateTimeout: a
	// reservation older than NameGrace with no create behind it is free.
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CreateTimeout)
	defer cancel()
	if err := s.reserve(ctx, r.Name, id); err != nil {
		return events.View{}, err
	}
	c.ID = id
	c.Node = node
	// The env values go into the log sealed, their names in clear (see
	// compute's SealEnv); the driver gets them opened.
	if r.Env, c.EnvSealed, err = s.creds.SealEnv(id, r.Env); err != nil {
		return events.View{}, err
	}
	meta := events.Meta{Actor: c.Actor, CommandID: c.CommandID, CorrelationID: c.CommandID}
	decideCreate := func(sb *Sandbox) ([]events.Event, error) {
		if sb.Exists() && sb.seen(c.CommandID) {
			return nil, nil // a retried create that landed
		}
		return decide(sb, c, compute.Capabilities{})
	}
	var sb *Sandbox
	if c.IdempotencyKey == "" {
		// The id was minted just now, so its subject is empty: no need to
		// read it (the append still states expected sequence 0).
		sb, err = s.appendFrom(ctx, &Sandbox{ID: id}, false, meta, c.CommandID, decideCreate)
	} else {
		sb, err = s.append(ctx, id, false, meta, c.CommandID, decideCreate)
	}
	if err != nil {
		if !errors.Is(err, events.ErrUnavailable) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = s.names.Release(rctx, r.Name, id)
			cancel()
		}
		// An append that may have landed keeps its reservation; one that
		// did not frees it after NameGrace.
		return events.View{}, err
	}
	return s.answer(ctx, c, sb)
}

// reserve claims name for id, taking it over from a holder that is deleted,
// or that has no events past the name grace (its create never landed).
func (s *Service) reserve(ctx context.Context, name, id string) error {
	holder, err := s.names.Reserve(ctx, name, id)
	if err == nil || holder.ID == id {
		return nil
	}
	if !errors.Is(err, ErrNameTaken) {
		return fmt.Errorf("reserve name %s: %w", name, err)
	}
	// Read the holder without its lock: deleted is terminal, and a holder
	// with no events past the grace has no create in flight (CreateTimeout
	// ended it), so a stale read can only refuse, never take a live name.
	h, _, herr := s.load(ctx, holder.ID)
	free := herr == nil && (h.Gone() || (!h.Exists() && s.now().Sub(holder.Since) > s.cfg.NameGrace))
	if !free {
		return events.Errorf(events.CodeAlreadyExists, "name %q is in use by sandbox %s", name, holder.ID)
	}
	if err := s.names.Take(ctx, name, holder.ID, id); err != nil {
		return events.Errorf(events.CodeAborted, "name %q: %v; retry", name, err)
	}
	return nil
}

// Resolve turns an id or a name into a sandbox id.
func (s *Service) Resolve(ctx context.Context, ref string) (string, error) {
	if ParseID(ref) == nil {
		return ref, nil
	}
	if !validName.MatchString(ref) {
		return "", events.Errorf(events.CodeInvalidArgument, "invalid sandbox id or name %q: want a lower-case uuid or a name (1 to 63 of a-z 0-9 . _ -, alphanumeric at both ends, no two dots in a row)", ref)
	}
	id, err := s.names.Lookup(ctx, ref)
	if errors.Is(err, events.ErrNotFound) {
		return "", events.Errorf(events.CodeNotFound, "sandbox %q not found", ref)
	}
	if err != nil {
		return "", err
	}
	// The bucket is on the bus: an entry is trusted only if the log agrees,
	// the sandbox created with that name and not deleted, so that a name
	// pointed at another sandbox (or at nothing) never makes a command act
	// on the wrong one.
	if ParseID(id) != nil {
		s.log.Warn().Str("name", ref).Str("sandbox_id", id).Msg("names entry passed over: not a sandbox id")
		return "", events.Errorf(events.CodeNotFound, "sandbox %q not found", ref)
	}
	sb, _, err := s.load(ctx, id)
	if err != nil {
		return "", err
	}
	if !sb.Exists() || sb.Gone() || sb.Spec.Name != ref {
		s.log.Warn().Str("name", ref).Str("sandbox_id", id).Str("created_as", sb.Spec.Name).
			Msg("names entry passed over: the log does not give the sandbox that name")
		return "", events.Errorf(events.CodeNotFound, "sandbox %q not found", ref)
	}
	return id, nil
}

// ViewAt folds sandbox id's log up to seq (0: no bound) or time at (zero: no
// bound): what the sandbox was then.
func (s *Service) ViewAt(ctx context.Context, id string, seq uint64, at time.Time) (events.View, error) {
	envs, err := s.store.Load(ctx, id, 0)
	if err != nil {
		return events.View{}, fmt.Errorf("load %s: %w", id, err)
	}
	var v events.View
	for _, env := range envs {
		if (seq != 0 && env.Seq > seq) || (!at.IsZero() && env.Time.After(at)) {
			break
		}
		// Through the table, as the aggregate folds: an event it refuses
		// (forged, or a writer's bug) is passed over here too.
		if _, err := v.Apply(env); err != nil {
			s.refused.note(env, err, s.log)
		}
	}
	if v.Seq == 0 {
		return v, events.Errorf(events.CodeNotFound, "sandbox %s did not exist then", id)
	}
	return v, nil
}

// attached reports whether the supervisor of generation gen is the one
// attached to sandbox id now (FAILED_PRECONDITION when it is not), on the
// state at the subject's head (one read of its last sequence per report).
func (s *Service) attached(ctx context.Context, id string, gen int64) error {
	defer s.lock(id)()
	sb, cached, err := s.load(ctx, id)
	if err == nil && cached {
		// Checked at the subject's head, taken or refused: another
		// gateway may have recorded the detach (or a new generation)
		// since this one cached the sandbox, and a beat taken from a
		// stale cache would tell a detached supervisor it is attached.
		sb, err = s.refresh(ctx, sb)
	}
	switch {
	case err != nil:
		return err
	case !sb.Exists():
		return events.Errorf(events.CodeNotFound, "sandbox %s not found", id)
	case sb.Attached != gen || sb.Owner() != gen:
		return fenced(events.Errorf(events.CodeFailedPrecondition, "sandbox %s: generation %d is not the attached one", id, gen))
	}
	return nil
}

// DriverInfo is one driver as GET /v1/drivers lists it.
type DriverInfo struct {
	Name         string               `json:"name"`
	Capabilities compute.Capabilities `json:"capabilities"`
}

// DriverList lists the drivers with what each can do (for a sandbox with no
// options).
func (s *Service) DriverList() []DriverInfo {
	names := s.drivers.Names()
	out := make([]DriverInfo, 0, len(names))
	for _, n := range names {
		caps, _ := s.drivers.Capabilities(n, nil)
		out = append(out, DriverInfo{Name: n, Capabilities: caps})
	}
	return out
}

// Logs returns the last tail lines of sandbox id's workload output, from
// its driver.
func (s *Service) Logs(ctx context.Context, id string, tail int) ([]byte, error) {
	sb, err := s.Sandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	out, err := s.drivers.Logs(ctx, sb.Spec.Driver, compute.SpecOf(id, &sb.Spec), tail)
	if err != nil {
		return nil, fmt.Errorf("logs of %s: %w", id, err)
	}
	return out, nil
}

// Dial connects to port of sandbox id's workload, through its driver.
func (s *Service) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	sb, err := s.Sandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.drivers.Dial(ctx, sb.Spec.Driver, compute.SpecOf(id, &sb.Spec), port)
}

// History returns the events of id after seq.
func (s *Service) History(ctx context.Context, id string, after uint64) ([]events.Envelope, error) {
	if _, err := s.Sandbox(ctx, id); err != nil {
		return nil, err
	}
	return s.store.Load(ctx, id, after)
}

// HistoryFrom returns the events of id after seq as History does, those a
// view holds from it and the rest (what it has yet to apply) from the log,
// so that the answer is the log's whatever the view's lag.
func (s *Service) HistoryFrom(ctx context.Context, id string, after uint64, h Histories) ([]events.Envelope, error) {
	if _, err := s.Sandbox(ctx, id); err != nil {
		return nil, err
	}
	envs, err := h.History(ctx, id, after)
	if err != nil {
		return nil, err
	}
	if n := len(envs); n > 0 {
		after = max(after, envs[n-1].Seq)
	}
	rest, err := s.store.Load(ctx, id, after)
	if err != nil {
		return nil, err
	}
	return append(envs, rest...), nil
}
