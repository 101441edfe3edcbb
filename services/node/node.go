// Package node is the assembled torpor service as a library: a Config in,
// a running Node out (Start), whose parts run until its context ends or
// Stop is called. cmd/torpor turns flags into a Config; tests and the bench
// start one or several nodes in one process through it.
package node

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/fanout"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/internal/busauth"
	"github.com/torpor/torpor/internal/embedded"
	"github.com/torpor/torpor/internal/metrics"
	"github.com/torpor/torpor/projections"
	"github.com/torpor/torpor/projections/kvview"
	"github.com/torpor/torpor/sagas"
	"github.com/torpor/torpor/services/access"
	"github.com/torpor/torpor/services/compute"
	"github.com/torpor/torpor/services/compute/process"
	"github.com/torpor/torpor/services/compute/remote"
	"github.com/torpor/torpor/services/compute/sim"
	"github.com/torpor/torpor/services/compute/supervisor"
	"github.com/torpor/torpor/services/compute/vm"
	"github.com/torpor/torpor/services/forward"
	"github.com/torpor/torpor/services/gateway"
	"github.com/torpor/torpor/web"
)

// Config is everything `torpor serve` takes from its flags.
type Config struct {
	Data       string
	HTTP       string
	NATSListen string
	NATSURL    string
	Fsync      string
	Node       string
	Deadline   time.Duration
	// DuplicateWindow is how long the stream remembers message ids
	// (jsstore.Config.DuplicateWindow). The server holds heap for every
	// append for that long, so the window sets the memory a busy service
	// needs (the figures are in the README, Choices: "Idempotency"); a
	// shorter window saves it, and a retried command older than the window
	// is then caught only by the sandbox's last 32 command ids.
	DuplicateWindow time.Duration
	// Torpor is the torpor binary the process driver's supervisors run;
	// default this executable. No flag sets it: tests that run the service
	// in their own binary point it at a built torpor.
	Torpor string
	// HeartbeatLimit is how long a supervisor that heartbeats may fall
	// silent before it is recorded detached (gateway.Config.HeartbeatLimit);
	// the process driver's supervisors beat three times within it.
	HeartbeatLimit time.Duration
	// RetainFor is how long a retained state is held from its suspension
	// when the create names no retain_for (gateway.Config.RetainFor);
	// zero keeps it for ever.
	RetainFor time.Duration
	// WakeTimeout bounds how long a connection to a forward of a sandbox
	// that wakes on traffic waits for its resume (forward.Config.WakeTimeout);
	// zero: 30s.
	WakeTimeout time.Duration
	// WakeMaxHeld is how many connections a sandbox that wakes on traffic
	// holds at once while it resumes (forward.Config.MaxHeld; 0: 64); one
	// more is refused at once.
	WakeMaxHeld int
	// LeaseTTL is how long the node's saga runner lease lasts unrenewed: a
	// second process serving the same node takes the sagas over this long
	// after the first dies (jsstore.LeaseConfig.TTL). No flag sets it;
	// zero: jsstore.DefaultLeaseTTL.
	LeaseTTL time.Duration
	// VMKernel is the guest kernel of the vm driver (--vm-kernel); empty:
	// $TORPOR_VM_KERNEL.
	VMKernel string
	// RemoteNodes are other nodes this service drives through their
	// drivers on the bus (`torpor driver --node N`, --remote-nodes).
	RemoteNodes []string
	// ProjectionDB is the URL of the SQL view's database (--projection-db,
	// CockroachDB or PostgreSQL); empty: no SQL view.
	ProjectionDB string
	// ReadFrom is the view the reads of the HTTP API come from
	// (--read-from): "kv" (also when empty) or "sql".
	ReadFrom string
	// NoAuth serves the HTTP API without tokens (--no-auth): every request
	// holds every scope. Only on a loopback --http, and warned of at every
	// start.
	NoAuth bool
	// HTTPHosts are the names, besides IP addresses and localhost, that a
	// request's Host may carry (--http-host; DNS rebinding is refused).
	HTTPHosts []string
	// CORSOrigins are the browser origins allowed across origins
	// (--cors-origin); none by default.
	CORSOrigins []string
	// MetricsOpen serves /metrics without a token (--metrics-open).
	MetricsOpen bool
	// TLSCert and TLSKey are the HTTP API's certificate and key files (PEM;
	// --tls-cert, --tls-key): set, it serves HTTPS only, and the embedded
	// NATS server takes TLS clients only, with the same certificate.
	TLSCert, TLSKey string
	// NATSCA is a PEM file of the CAs that torpor's own NATS clients (its
	// connection, its supervisors) trust besides the system's (--nats-ca);
	// empty with --tls-cert: the certificate file itself, whose
	// certificates are then the anchors.
	NATSCA string
	// TokenLimits bound each token's requests a second, watches and waits
	// on this server (--token-rate, --token-burst, --token-watches,
	// --token-waits); zero fields do not limit (the tests' and the
	// bench's service), the flags default to gateway.DefaultTokenLimits.
	TokenLimits gateway.TokenLimits
	// RunAs is whom the process driver's workloads run as (--run-as,
	// process.Config.RunAs); empty: the service's user.
	RunAs string
	// MaxLogBytes bounds the event log's storage (--max-log-bytes,
	// jsstore.Config.MaxBytes); 0: the default.
	MaxLogBytes int64
	// ReplayTTL is how long a view of the past is kept (--replay-ttl,
	// kvview.Reap); 0: the default.
	ReplayTTL time.Duration
	// HTTPTimeouts bound slow HTTP clients (--http-read-header-timeout,
	// --http-read-timeout, --http-write-timeout, --http-idle-timeout);
	// zero fields are the defaults (gateway.Timeouts).
	HTTPTimeouts gateway.Timeouts
	// NATSCreds is the NATS credentials file the service connects to
	// NATSURL with (--nats-creds, a service user: `torpor creds --role
	// service`); empty: none, as the server wants it.
	NATSCreds string
	// Replicas is how many copies the NATS cluster keeps of the log, of
	// every KV bucket and of the object store (--replicas): 0 takes what
	// the existing streams have, 1 on a new bus (the embedded server is
	// one server: 1 only). A stream with fewer refuses the start unless
	// RaiseReplicas (--raise-replicas) raises it; see decideReplicas.
	Replicas      int
	RaiseReplicas bool
	// wrapStore, when set, wraps the store the command service appends
	// and reads through: the fault tests make appends fail. No flag sets
	// it.
	wrapStore func(events.Store) events.Store
	// ActivityWindow is the activity window (--activity-window): a
	// sandbox.active is appended at most once per window per sandbox, and
	// a forward reports its bytes at most once per window (README
	// "Activity"); zero: DefaultActivityWindow.
	ActivityWindow time.Duration
	// WrapDrivers, when set, may replace drivers of the registry before
	// anything uses them: tests wrap a real driver to make it refuse a call.
	// No flag sets it.
	WrapDrivers func(compute.Registry)
	// IdleAfter, IdleAction and IdleFallback are the idle policy of a
	// create that names none (--idle-after, --idle-action,
	// --idle-fallback; README "Idle and wake"): zero IdleAfter for none,
	// "" action and fallback for suspend and none.
	IdleAfter    time.Duration
	IdleAction   string
	IdleFallback string
}

// idle is c's default idle policy, zero for none, or why it is none.
func (c Config) idle() (events.IdlePolicy, error) {
	if c.IdleAfter == 0 {
		if c.IdleAction != "" || c.IdleFallback != "" {
			return events.IdlePolicy{}, errors.New("--idle-action, --idle-fallback: want --idle-after too")
		}
		return events.IdlePolicy{}, nil
	}
	p, err := events.NewIdlePolicy(c.IdleAfter.String(), c.IdleAction, c.IdleFallback, cmp.Or(c.ActivityWindow, DefaultActivityWindow))
	if err != nil {
		return events.IdlePolicy{}, fmt.Errorf("--idle-after %s, --idle-action %q, --idle-fallback %q: %s", c.IdleAfter, c.IdleAction, c.IdleFallback, err.Error())
	}
	return *p, nil
}

// DefaultActivityWindow is --activity-window's default (README "Activity").
const DefaultActivityWindow = gateway.DefaultActivityWindow

// minHeartbeatLimit is the shortest --heartbeat-limit: supervisors beat
// every third of it, and a beat takes a round trip on the bus.
const minHeartbeatLimit = 100 * time.Millisecond

func (c Config) Validate() error {
	switch {
	case c.Fsync != "always" && c.Fsync != "interval":
		return fmt.Errorf("--fsync %q: want always or interval", c.Fsync)
	case c.Deadline <= 0:
		return fmt.Errorf("--deadline %s: want a positive duration", c.Deadline)
	case c.DuplicateWindow < time.Second:
		return fmt.Errorf("--duplicate-window %s: want 1s or more", c.DuplicateWindow)
	case c.NATSURL == "" && c.Data == "":
		return errors.New("--data: want a directory")
	case c.RetainFor < 0:
		return fmt.Errorf("--retain-for %s: want a positive duration, or 0 to keep retained states for ever", c.RetainFor)
	case c.WakeTimeout < 0:
		return fmt.Errorf("--wake-timeout %s: want a positive duration", c.WakeTimeout)
	case c.WakeMaxHeld < 0:
		return fmt.Errorf("--wake-max-held %d: want a positive number", c.WakeMaxHeld)
	case c.HeartbeatLimit < minHeartbeatLimit:
		return fmt.Errorf("--heartbeat-limit %s: want %s or more (supervisors beat three times within it)", c.HeartbeatLimit, minHeartbeatLimit)
	case c.HTTP == "":
		return errors.New("--http: want an address")
	case c.ReadFrom != "" && c.ReadFrom != "kv" && c.ReadFrom != "sql":
		return fmt.Errorf("--read-from %q: want kv or sql", c.ReadFrom)
	case c.MaxLogBytes < -1:
		return fmt.Errorf("--max-log-bytes %d: want a positive size, or -1 for no bound", c.MaxLogBytes)
	case c.ActivityWindow < 0:
		return fmt.Errorf("--activity-window %s: want a positive duration", c.ActivityWindow)
	case c.IdleAfter < 0:
		return fmt.Errorf("--idle-after %s: want a positive duration, or 0 for no idle policy", c.IdleAfter)
	case c.ReplayTTL < 0:
		return fmt.Errorf("--replay-ttl %s: want a positive duration", c.ReplayTTL)
	case c.HTTPTimeouts.ReadHeader < 0:
		return fmt.Errorf("--http-read-header-timeout %s: want a positive duration", c.HTTPTimeouts.ReadHeader)
	case c.HTTPTimeouts.Read < 0:
		return fmt.Errorf("--http-read-timeout %s: want a positive duration", c.HTTPTimeouts.Read)
	case c.HTTPTimeouts.Write < 0:
		return fmt.Errorf("--http-write-timeout %s: want a positive duration", c.HTTPTimeouts.Write)
	case c.HTTPTimeouts.Idle < 0:
		return fmt.Errorf("--http-idle-timeout %s: want a positive duration", c.HTTPTimeouts.Idle)
	case c.ReadFrom == "sql" && c.ProjectionDB == "":
		return errors.New("--read-from sql: wants the SQL view, --projection-db")
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("--tls-cert and --tls-key go together")
	case c.NoAuth && !gateway.Loopback(c.HTTP):
		return fmt.Errorf("--no-auth with --http %s: serving without tokens is for a loopback address only (127.0.0.1, [::1], localhost)", c.HTTP)
	case c.Replicas < 0 || c.Replicas > MaxReplicas:
		return fmt.Errorf("--replicas %d: want 1 to %d (left out: what the existing streams have)", c.Replicas, MaxReplicas)
	case c.NATSURL == "" && c.Replicas > 1:
		return fmt.Errorf("--replicas %d: the embedded NATS server is one server; a cluster is joined with --nats-url", c.Replicas)
	case c.RaiseReplicas && c.Replicas == 0:
		return errors.New("--raise-replicas: wants --replicas N, the replicas to raise to")
	case !validNode.MatchString(c.Node):
		return fmt.Errorf("--node %q: want 1 to 63 lower-case letters, digits, '-' or '_', starting and ending with a letter or digit (it names subjects and keys)", c.Node)
	}
	if c.RunAs != "" {
		if _, err := process.LookupUser(c.RunAs); err != nil {
			return fmt.Errorf("--run-as: %w", err)
		}
	}
	if c.NATSURL == "" {
		if err := c.embedded().Validate(); err != nil {
			return fmt.Errorf("--nats-listen: %w", err)
		}
	}
	if _, err := c.idle(); err != nil {
		return err
	}
	return nil
}

// natsCA is the CA file torpor's own NATS clients trust: --nats-ca, else,
// with --tls-cert on the embedded server, that certificate's file.
func (c Config) natsCA() string {
	if c.NATSCA != "" || c.NATSURL != "" {
		return c.NATSCA
	}
	return c.TLSCert
}

// embedded is the embedded NATS server of c, when it has no --nats-url.
func (c Config) embedded() embedded.Config {
	return embedded.Config{Data: c.Data, Listen: c.NATSListen, SyncAlways: c.Fsync == "always", Name: "torpor-" + c.Node}
}

// validNode is what a node name may be: a sandbox name (as the gateway
// wants it) without dots, so that it is one token of NATS subjects
// (torpor.driver.<node>.<op>) and of KV keys.
var validNode = regexp.MustCompile(`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)

// viewHold is how long the KV view may hold back a transient phase for its
// outcome (kvview.Config.HoldTransient): with the sim driver an outcome
// follows its intent within a few milliseconds, and one write then stores
// both, which halves the view's writes (the figures are in the README,
// Choices: "Reads"). A reader sees a transient phase at most this much
// later; outcomes are never held.
const viewHold = 10 * time.Millisecond

// sharedStore is the store with Follow served by a shared reading of the
// log (fanout), for the followers in this process.
type sharedStore struct {
	*jsstore.Store
	log *fanout.Log
}

func (s sharedStore) Follow(ctx context.Context, after uint64, max int, h events.FollowHandler) error {
	return s.log.Follow(ctx, after, max, h)
}

// Replicas is how many copies the cluster keeps of each of the node's
// streams, buckets and object store.
func (a *Node) Replicas() int { return a.replicas }

// Node is a running torpor service: every part started, the addresses bound.
type Node struct {
	httpAddr string
	// httpScheme is https with --tls-cert, else http.
	httpScheme string
	natsURL    string
	// replicas is what decideReplicas gave every stream of the node.
	replicas int

	ns     *server.Server
	nc     *nats.Conn
	cancel context.CancelFunc
	// done is closed once every part stopped, with err the first error.
	done   chan struct{}
	err    error
	hsrv   *http.Server
	driver *sim.Driver
	// vm is the node's own vm driver, whose spare supervisor Stop lets go.
	vm    *vm.Driver
	svc   *gateway.Service
	store *jsstore.Store
	proj  *projections.Runner
	// adminToken is the secret of <data>/admin.token, "" without one
	// (--no-auth, no --data, or a file whose token was revoked).
	adminToken string
	// adminMinted says this start minted the admin token.
	adminMinted bool
	sql         *sqlPart // nil without --projection-db
	// auth is the bus's operator and accounts, from <data>/auth: made on
	// the first start of the embedded server; with --nats-url, there when
	// the directory is (so that this service mints its supervisors' users).
	auth *busauth.Auth
	// user is who the service connects as: minted under auth, or read from
	// --nats-creds.
	user *busauth.User
	// data is --data; name is --node.
	data, name string
	// parts names the long-running parts, in the order they start.
	parts     []string
	closeOnce sync.Once
}

// Start binds and starts every part of the service; they run until ctx ends
// or Stop is called. Wait returns when all have finished.
func Start(ctx context.Context, cfg Config, log zerolog.Logger) (*Node, error) {
	end := time.Now().Add(startRetry)
	for {
		n, err := startOnce(ctx, cfg, log)
		if err == nil || cfg.NATSURL == "" || !clusterBusy(err) || time.Now().After(end) {
			return n, err
		}
		log.Warn().Err(err).Msg("the NATS cluster could not take the start's streams yet: starting again")
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(time.Second):
		}
	}
}

// startRetry bounds how long a start on a NATS cluster is tried again while
// the cluster answers too slowly or cannot place a stream (servers starting,
// an election): compose and Kubernetes would restart the process, the two
// commands of the README would not.
const startRetry = 2 * time.Minute

// clusterBusy says whether err is of a cluster that may take the start in a
// moment.
func clusterBusy(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || events.CodeOf(err) == events.CodeUnavailable {
		return true
	}
	// An account's JetStream is enabled on each server of a cluster as its
	// claims reach it: just after the clients' account is pushed, a server
	// that has not seen them answers "jetstream not enabled for account"
	// (TestReplicas failed so in CI).
	if errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		return true
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "no suitable peers") || strings.Contains(msg, "jetstream not enabled") ||
		strings.Contains(msg, "jetstream system temporarily unavailable")
}

// startOnce is one try of Start.
func startOnce(ctx context.Context, cfg Config, log zerolog.Logger) (a *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, invalid(err)
	}
	a = &Node{data: cfg.Data, name: cfg.Node}
	parts := a // a is nil once a return gives an error
	defer func() {
		if err != nil {
			parts.close()
		}
	}()
	if cfg.ProjectionDB != "" {
		// Before anything else: a URL or a schema the SQL view refuses
		// stops the start here (a database that is down does not).
		if a.sql, err = openSQL(ctx, cfg.ProjectionDB, log.With().Str("part", "sqlview").Logger()); err != nil {
			return nil, err
		}
	}
	var tlsConfig *tls.Config
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, invalid(fmt.Errorf("--tls-cert, --tls-key: %w", err))
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	natsCA := cfg.natsCA()
	url := cfg.NATSURL
	if err := a.openAuth(cfg); err != nil {
		return nil, err
	}
	if url == "" {
		ec := cfg.embedded()
		ec.Operator, ec.Accounts, ec.SystemAccount = a.auth.OperatorJWT, a.auth.Accounts(), a.auth.SystemKey
		ec.TLS = tlsConfig // the bus's clients verify the same certificate as the API's
		if a.ns, err = embedded.Start(ec); err != nil {
			return nil, err
		}
		url = a.ns.ClientURL()
	}
	a.natsURL = url
	opts := []nats.Option{nats.Name("torpor " + cfg.Node), nats.MaxReconnects(-1), nats.SyncQueueLen(jsstore.SyncQueueLen)}
	if a.user != nil {
		opts = append(opts, a.user.Options()...)
	}
	if natsCA != "" {
		opts = append(opts, nats.RootCAs(natsCA))
	}
	if a.nc, err = nats.Connect(url, opts...); err != nil {
		return nil, fmt.Errorf("connect %s: %w", url, err)
	}
	js, err := jetstream.New(a.nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if cfg.NATSURL != "" {
		if err := awaitCluster(ctx, js, max(cfg.Replicas, 1), cfg.Node, log); err != nil {
			return nil, err
		}
	}
	replicas, err := decideReplicas(ctx, js, cfg.Replicas, cfg.RaiseReplicas)
	if err != nil {
		return nil, err
	}
	a.replicas = replicas
	js = consistent(js, replicas)
	// Every part records into one set of metrics, served on GET /metrics.
	m := metrics.New()
	store, err := jsstore.New(ctx, js, jsstore.Config{Replicas: replicas, DuplicateWindow: cfg.DuplicateWindow, MaxBytes: cfg.MaxLogBytes, GroupCommit: groupCommit(cfg), OnForeign: func(f jsstore.Foreign) {
		m.Foreign()
		log.Warn().Err(f.Err).Str("subject", f.Subject).Uint64("seq", f.Seq).Msg("skipped a message that is not a torpor event")
	}, OnBadPosition: func(name string, err error) {
		log.Warn().Err(err).Str("position", name).Msg("a position that is no sequence: following the log from its start")
	}})
	if err != nil {
		return nil, err
	}
	// The view is derived: on the embedded server its bucket (one replica)
	// skips the per-write fsync, and New sets its checkpoint back after a
	// crash that lost writes it covered (kvview's persist.go).
	derivedAsync := a.ns != nil && replicas == 1
	view, err := kvview.New(ctx, js, kvview.Config{Replicas: replicas, CheckpointEvery: 100 * time.Millisecond, HoldTransient: viewHold, Metrics: m, PastTTL: cfg.ReplayTTL, Log: store, AsyncPersist: derivedAsync})
	if err != nil {
		return nil, err
	}
	reportPersistence(view, derivedAsync, log)
	if err := a.makeCopies(ctx, url, natsCA, cfg.MaxLogBytes, replicas, log); err != nil {
		return nil, err
	}
	names, err := gateway.NewKVNames(ctx, js, replicas)
	if err != nil {
		return nil, err
	}
	creds, err := Credentials(log.WithContext(ctx), js, replicas) // the logger for a replaced secret
	if err != nil {
		return nil, err
	}
	tokens, err := access.Open(ctx, js, replicas)
	if err != nil {
		return nil, err
	}
	quota, err := access.OpenQuota(ctx, js, replicas)
	if err != nil {
		return nil, err
	}
	guard := gateway.HTTPGuard{Auth: tokens, Hosts: cfg.HTTPHosts, Origins: cfg.CORSOrigins, MetricsOpen: cfg.MetricsOpen, Limits: cfg.TokenLimits}
	if cfg.NoAuth {
		guard.Auth = nil
		log.Warn().Str("http", cfg.HTTP).Msg("--no-auth: the HTTP API takes every request from loopback without a token, with every scope")
	} else if cfg.Data != "" {
		if err := a.bootstrapAdmin(ctx, tokens, cfg); err != nil {
			return nil, err
		}
	}
	creds = creds.WithBus(a.supervisorCreds(log))
	if a.driver, err = sim.New(busReporter(a.nc), sim.Config{Data: cfg.Data}); err != nil {
		return nil, err
	}
	drivers := compute.Registry{"sim": a.driver}
	// The process driver's sandboxes live under --data and their
	// supervisors report on the NATS the service runs on (they need one
	// they can dial). Shutting the service down leaves them running: a
	// restart finds them.
	if cfg.Data != "" && (cfg.NATSURL != "" || cfg.NATSListen != "") {
		if drivers["process"], err = process.New(process.Config{Data: cfg.Data, NATSURL: url, NATSCA: natsCA, Binary: cfg.Torpor, Heartbeat: cfg.HeartbeatLimit / 3, Path: os.Getenv("PATH"), RunAs: cfg.RunAs}); err != nil {
			return nil, err
		}
		WarnRoot(log, cfg.RunAs)
		// The vm driver is there whatever the node has: a node without
		// QEMU or a kernel refuses each vm create, saying what it lacks.
		if a.vm, err = newVM(a.nc, replicas, cfg.Data, url, natsCA, cfg.Torpor, cfg.VMKernel, cfg.HeartbeatLimit/3, len(cfg.RemoteNodes) > 0, log); err != nil {
			return nil, err
		}
		drivers["vm"] = a.vm
	}
	if cfg.WrapDrivers != nil {
		cfg.WrapDrivers(drivers)
	}
	if len(cfg.RemoteNodes) > 0 {
		// Each driver's calls go to the node the sandbox is on: this
		// service's own, or another's `torpor driver` on the bus.
		for name, d := range drivers {
			drivers[name] = &compute.Routed{Local: cfg.Node, Here: d, There: func(node string) compute.Driver {
				return remote.NewClient(a.nc, node, name)
			}}
		}
	}
	var appends events.Store = store
	if cfg.wrapStore != nil {
		appends = cfg.wrapStore(store)
	}
	gcfg := gateway.Config{Node: cfg.Node, Nodes: cfg.RemoteNodes, HeartbeatLimit: cfg.HeartbeatLimit, Metrics: m, Unavailable: store.Unavailable}
	gcfg.RetainFor = cfg.RetainFor
	gcfg.ActivityWindow = cmp.Or(cfg.ActivityWindow, DefaultActivityWindow)
	if gcfg.Idle, err = cfg.idle(); err != nil {
		return nil, err
	}
	if a.user != nil {
		// A bus with accounts: torpor's own commands come answered on
		// its inbox, anything else in its account is refused.
		gcfg.ServiceInbox = busauth.ServiceInbox
	}
	svc, err := gateway.NewService(appends, names, drivers, creds, gcfg, log.With().Str("part", "gateway").Logger())
	if err != nil {
		return nil, err
	}
	a.svc = svc
	// The sagas and the view follow the log through one shared reading: the
	// server delivers each event once, the process decodes it once.
	followed := sharedStore{Store: store, log: fanout.New(store)}
	// A runner per node this service drives (its own and --remote-nodes),
	// each with its own position and under its own lease: one runner per
	// node at a time, however many processes serve or drive it; the others
	// wait to take it over.
	var sagaRuns []func(ctx context.Context) error
	for _, n := range append([]string{cfg.Node}, cfg.RemoteNodes...) {
		run, err := leasedSagas(ctx, store, followed, svc, drivers, creds, cfg, n, m, log)
		if err != nil {
			return nil, err
		}
		sagaRuns = append(sagaRuns, run)
	}
	// The view never goes back in seq, so a projection must not skip past an
	// event it failed to apply: it retries (with backoff) until it lands.
	proj, err := projections.NewRunner(followed, view, projections.Config{Attempts: 1 << 30, Logger: log.With().Str("part", "kvview").Logger(), Parked: m.Parked("kv")})
	if err != nil {
		return nil, err
	}
	if a.sql != nil {
		a.sql.parked = m.Parked("sql")
		if err := a.sql.attach(followed); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", cfg.HTTP)
	if err != nil {
		return nil, fmt.Errorf("--http %s: %w", cfg.HTTP, err)
	}
	a.httpAddr = ln.Addr().String()
	a.httpScheme = "http"
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
		a.httpScheme = "https"
	}
	a.store, a.proj = store, proj
	fwdIndex, err := forward.NewKVIndex(ctx, js, replicas)
	if err != nil {
		return nil, err
	}
	fwd := forward.New(sandboxes{svc: svc}, fwdIndex, forward.Config{Window: gcfg.ActivityWindow, WakeTimeout: cfg.WakeTimeout, MaxHeld: cfg.WakeMaxHeld, Metrics: m}, log.With().Str("part", "forwards").Logger())
	// Every wait of this process (HTTP, SDKs) is served from one watch of
	// the KV view, not a consumer per request.
	// It runs as the first part (below), so that it stops last.
	follower := view.Follower()
	kv := viewAdapter{v: view, f: follower}
	var reads gateway.Views = kv
	if cfg.ReadFrom == "sql" {
		reads = sqlViews{kv: kv, sql: a.sql}
	}
	m.Phases(phaseNames, func(ctx context.Context) (map[string]int, error) { return phaseCounts(ctx, reads) })
	m.Lags(a.lags)
	h := gateway.NewHTTP(svc, reads, a.Ready, log.With().Str("part", "http").Logger()).WithGuard(guard).WithForwards(fwd).WithLags(a.lags).WithMetrics(m.Handler()).WithTokens(tokens).WithQuota(quota)
	readFrom := cfg.ReadFrom
	if readFrom == "" {
		readFrom = "kv"
	}
	h.WithServerInfo(gateway.ServerInfo{Node: cfg.Node, DeadlineSeconds: cfg.Deadline.Seconds(), ReadFrom: readFrom})
	h.WithLogSandboxes(store.Sandboxes) // torpor check: the sandboxes of the log, not of a view
	h.WithDashboard(web.Handler())      // GET /, GET /ui/...: static, no token
	// torpor replay: a rebuild streams its progress, so the server has no
	// write timeout.
	replay := ReplayDeps{Store: store, KV: view, Log: log.With().Str("part", "replay").Logger()}
	if a.sql != nil {
		replay.SQL = a.sql.reader // UNAVAILABLE until its database was reached
	}
	h.Handle("POST /v1/replay", events.ScopeAdmin, NewReplayHandler(replay))
	// Slow or idle clients are cut off (gateway.Timeouts); watch, wait and
	// replay lift the deadlines for their own answers.
	a.hsrv = cfg.HTTPTimeouts.Server(h)

	// The long-running parts, in the order they start; they stop in the
	// reverse order (actors).
	g := newActors(ctx)
	g.add("kvfollow", follower.Run)
	bus := gateway.NewBus(a.nc, svc, 0, log.With().Str("part", "bus").Logger())
	busCtx := g.add("bus", bus.Run)
	if err := bus.Listen(busCtx); err != nil {
		g.cancel()
		_ = ln.Close()
		return nil, err
	}
	// A round trip to the server, so that its subscriptions are in place
	// when Start returns: a request sent right after must find a responder.
	if err := a.nc.FlushTimeout(10 * time.Second); err != nil {
		g.cancel()
		_ = ln.Close()
		return nil, fmt.Errorf("bus: %w", err)
	}
	for i, run := range sagaRuns {
		name := "sagas"
		if i > 0 {
			name += " " + cfg.RemoteNodes[i-1]
		}
		g.add(name, run)
	}
	g.add("tokens", tokens.Run)
	g.add("kvview", proj.Run)
	if a.sql != nil {
		g.add("sqlview", a.sql.Run)
	}
	g.add("forwards", func(ctx context.Context) error {
		// The forwards the log still has open come back where they were bound.
		if _, err := fwd.Restore(ctx); err != nil {
			log.Warn().Err(err).Str("part", "forwards").Msg("forwards not brought back")
		}
		fwd.Run(ctx)
		return nil
	})
	if a.ns != nil && a.auth != nil && cfg.Data != "" {
		g.add("revocations", func(ctx context.Context) error {
			return a.followRevocations(ctx, filepath.Join(cfg.Data, "auth"), log)
		})
	}
	g.add("reaper", func(ctx context.Context) error {
		// Views of the past (KV buckets, SQL tables) expire after
		// --replay-ttl, and a crash mid-rebuild leaves a bucket: all are
		// removed here.
		ttl := cmp.Or(cfg.ReplayTTL, kvview.DefaultPastTTL)
		for {
			if gone, err := kvview.Reap(ctx, js, "", ttl, time.Now()); err != nil {
				log.Warn().Err(err).Str("part", "reaper").Msg("replay buckets not reaped")
			} else if len(gone) > 0 {
				log.Info().Strs("buckets", gone).Str("part", "reaper").Msg("replay buckets removed")
			}
			if a.sql != nil {
				if gone, err := a.sql.reapPast(ctx, ttl, time.Now()); err != nil {
					log.Warn().Err(err).Str("part", "reaper").Msg("SQL views of the past not reaped")
				} else if len(gone) > 0 {
					log.Info().Strs("tables", gone).Str("part", "reaper").Msg("SQL views of the past removed")
				}
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(max(min(ttl/4, time.Hour), time.Second)):
			}
		}
	})
	g.add("http", func(ctx context.Context) error {
		served := make(chan error, 1)
		go func() { served <- a.hsrv.Serve(ln) }()
		select {
		case err := <-served:
			return err // never http.ErrServerClosed: only Shutdown below closes it
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := a.hsrv.Shutdown(sctx)
		if err != nil {
			// Requests still open after the grace (a wait or a watch that
			// outlives it) are cut, so that their clients ask another
			// instance rather than wait on one that stopped.
			err = a.hsrv.Close()
		}
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
		return err
	})
	for _, p := range g.list {
		a.parts = append(a.parts, p.name)
	}
	var runCtx context.Context
	runCtx, a.cancel = context.WithCancel(ctx)
	a.done = make(chan struct{})
	go func() {
		defer close(a.done)
		a.err = g.run(runCtx, log)
	}()
	return a, nil
}

// leasedSagas builds the saga runner of node n, with its own position, and
// returns its run: under n's lease (sagas.PositionKey(n) in
// jsstore.LeaseBucket), waiting for it while another process holds it, and
// fenced by it.
func leasedSagas(ctx context.Context, store *jsstore.Store, followed sagas.Source, svc *gateway.Service, drivers compute.Registry, creds *compute.Credentials, cfg Config, n string, m *metrics.Set, log zerolog.Logger) (func(context.Context) error, error) {
	log = log.With().Str("part", "sagas").Str("node", n).Logger()
	pos, err := store.Position(ctx, sagas.PositionKey(n))
	if err != nil {
		return nil, err
	}
	lease, err := store.Lease(ctx, sagas.PositionKey(n), jsstore.LeaseConfig{TTL: cfg.LeaseTTL, Holder: leaseHolder(cfg.Data), Log: log})
	if err != nil {
		return nil, err
	}
	sc := sagas.Config{Node: n, Deadline: cfg.Deadline, Metrics: m, Fence: lease.Held, Unavailable: store.Unavailable}
	// The long timers' keys (ttl, retention, idle): the position passes
	// the events that armed them (sagas/timer.go).
	if sc.Timers, err = store.Timers(ctx, sagas.PositionKey(n)); err != nil {
		return nil, err
	}
	newRunner := func() (*sagas.Runner, error) { return sagas.New(followed, pos, svc, drivers, creds, sc, log) }
	runner, err := newRunner() // the config's problems now, not once the lease is held
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return lease.Run(ctx, func(ctx context.Context) error {
			for {
				r := runner
				runner = nil // a Runner runs once: the lease lost and taken again runs a new one
				if r == nil {
					var err error
					if r, err = newRunner(); err != nil {
						return err
					}
				}
				err := r.Run(ctx)
				if err == nil || ctx.Err() != nil || !clusterBusy(err) {
					return err
				}
				// The bus could not answer the runner's start (its
				// position read in an election: "JetStream system
				// temporarily unavailable"): that stopped the whole node
				// once. Run again, still holding the lease.
				log.Warn().Err(err).Msg("the sagas could not start on the bus: starting them again")
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
			}
		})
	}, nil
}

// leaseHolder names this process as the holder of its node's lease: by
// host and data directory, which one process at a time uses, so that a
// restart after a crash takes the lease back at once; without a data
// directory, at random (jsstore.LeaseConfig.Holder).
func leaseHolder(data string) string {
	if data == "" {
		return ""
	}
	host, _ := os.Hostname()
	if abs, err := filepath.Abs(data); err == nil {
		data = abs
	}
	return host + " " + data
}

// bootstrapAdmin makes sure the operator of this machine can reach the
// service: <data>/admin.token holds an admin token (minted on the first
// start), whose secret a keeps for the startup banner and the tests.
func (a *Node) bootstrapAdmin(ctx context.Context, tokens *access.Tokens, cfg Config) error {
	path := filepath.Join(cfg.Data, access.AdminFile)
	name, minted, err := tokens.Bootstrap(ctx, path, cfg.Node)
	if err != nil {
		return err
	}
	a.adminMinted = minted
	if name == "" {
		return nil // the file's token was revoked: the operator meant it
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	a.adminToken = strings.TrimSpace(string(data))
	return nil
}

// AdminToken is the secret of the admin token under --data ("" if none).
func (a *Node) AdminToken() string { return a.adminToken }

// phaseNames are the phases torpor_sandboxes reports, 0 when none is in it.
var phaseNames = func() []string {
	out := make([]string, len(events.Phases))
	for i, p := range events.Phases {
		out[i] = string(p)
	}
	return out
}()

// phaseCounts is the count of each phase, as GET /v1/phases answers it,
// for torpor_sandboxes.
func phaseCounts(ctx context.Context, v gateway.Views) (map[string]int, error) {
	counts, err := v.Counts(ctx)
	out := make(map[string]int, len(counts))
	for p, n := range counts {
		out[string(p)] = n
	}
	return out, err
}

// HTTPAddr is where the HTTP API listens.
func (a *Node) HTTPAddr() string { return a.httpAddr }

// HTTPURL is the HTTP API's URL: https:// with --tls-cert.
func (a *Node) HTTPURL() string { return a.httpScheme + "://" + a.httpAddr }

// NATSURL is the URL of the NATS server the service runs on.
func (a *Node) NATSURL() string { return a.natsURL }

// Server is the embedded NATS server, nil with --nats-url.
func (a *Node) Server() *server.Server { return a.ns }

// Ready reports whether the service may take traffic (/readyz).
func (a *Node) Ready(ctx context.Context) error {
	if !a.nc.IsConnected() {
		return errors.New("not connected to NATS")
	}
	if err := a.proj.Stuck(); err != nil {
		return err // retrying one event, or not following the log
	}
	lag, err := a.proj.Lag(ctx)
	if err != nil {
		return err
	}
	if lag > maxViewLag {
		return fmt.Errorf("phase view %d events behind", lag)
	}
	if a.sql != nil {
		return a.sql.Ready(ctx)
	}
	return nil
}

// lags is how many events each view has yet to apply, for /readyz.
func (a *Node) lags(ctx context.Context) map[string]uint64 {
	m := map[string]uint64{}
	if lag, err := a.proj.Lag(ctx); err == nil {
		m["kv"] = lag
	}
	if a.sql != nil {
		if lag, err := a.sql.Lag(ctx); err == nil {
			m["sql"] = lag
		}
	}
	return m
}

// ViewLag is how many events of the log the phase view has yet to apply.
func (a *Node) ViewLag(ctx context.Context) (uint64, error) { return a.proj.Lag(ctx) }

// Stop ends every part and waits for them.
func (a *Node) Stop() error {
	a.cancel()
	return a.Wait()
}

// Wait waits for every part to finish (they stop in the reverse order of
// their start, the view's follower last), then closes what they used, in
// the reverse order it was opened: the sim, the NATS connection, the
// embedded server, the SQL view's database.
func (a *Node) Wait() error {
	<-a.done
	a.closeOnce.Do(a.close)
	return a.err
}

// Run starts a node of cfg and runs it until ctx ends (Start, then Wait).
func Run(ctx context.Context, cfg Config, log zerolog.Logger) error {
	n, err := Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	return n.Wait()
}

func (a *Node) close() {
	if a.driver != nil {
		a.driver.Close()
	}
	if a.vm != nil {
		a.vm.Close()
	}
	if a.nc != nil {
		// Acks and naks are sent without waiting; flush them before closing,
		// or a handed-back event waits out the consumer's ack wait.
		_ = a.nc.FlushTimeout(2 * time.Second)
		a.nc.Close()
	}
	if a.ns != nil {
		a.ns.Shutdown()
		a.ns.WaitForShutdown()
	}
	if a.sql != nil {
		a.sql.Close()
	}
}

// credentials loads the supervisor credential secret from the KV bucket
// torpor_config, creating it on first start (the first writer wins, so every
// replica shares one secret).
func Credentials(ctx context.Context, js jetstream.JetStream, replicas int) (*compute.Credentials, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "torpor_config", Description: "torpor service settings", MaxBytes: 1 << 20, MaxValueSize: 4 << 10, Replicas: max(replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("config bucket: %w", err)
	}
	secret, err := compute.NewSecret()
	if err != nil {
		return nil, err
	}
	if _, err := kv.Create(ctx, "credential_secret", secret); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("credential secret: %w", err)
	}
	for range 3 {
		e, err := kv.Get(ctx, "credential_secret")
		if err != nil {
			return nil, fmt.Errorf("credential secret: %w", err)
		}
		creds, cerr := compute.NewCredentials(e.Value())
		if cerr == nil {
			return creds, nil
		}
		// A secret that is no secret (short, or garbage: the bucket is on
		// the bus) is replaced at its revision by a fresh one, so that the
		// service starts; every replica then reads the one that won. The
		// supervisor credentials minted from the old secret stop verifying:
		// their supervisors' reports are refused until their sandboxes
		// are started again.
		if _, err := kv.Update(ctx, "credential_secret", secret, e.Revision()); err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !isWrongLast(err) {
			return nil, fmt.Errorf("credential secret: %v; replace it: %w", cerr, err)
		}
		zerolog.Ctx(ctx).Warn().Err(cerr).Msg("credential secret replaced by a fresh one: live supervisor credentials stop verifying")
	}
	return nil, errors.New("credential secret: replaced under us three times")
}

// isWrongLast says whether err is a KV update that lost to another writer.
func isWrongLast(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// busReporter sends supervisor reports on torpor.supervisor.<id> and waits for
// the gateway to take them, retrying while nobody answers or an answer is
// not final (supervisor.Final: an append that failed once must not lose
// the report).
func busReporter(nc *nats.Conn) compute.Reporter {
	return compute.ReporterFunc(func(ctx context.Context, r compute.Report) error {
		data, err := json.Marshal(r)
		if err != nil {
			return err
		}
		backoff := 50 * time.Millisecond
		for {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			msg, err := nc.RequestWithContext(rctx, compute.ReportSubject(r.SandboxID), data)
			cancel()
			if err == nil {
				var body events.ErrorBody
				if json.Unmarshal(msg.Data, &body) == nil && body.Error != nil {
					if supervisor.Final(body.Error.Code) {
						return body.Error
					}
				} else {
					return nil
				}
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return ctx.Err()
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	})
}

// sandboxes is what the forwarder asks of a sandbox: its phase and open
// forwards from the command service, a connection to its port through its
// driver.
type sandboxes struct{ svc *gateway.Service }

func (s sandboxes) Phase(ctx context.Context, id, fid string) (events.Phase, bool, error) {
	sb, err := s.svc.Sandbox(ctx, id)
	if err != nil {
		return "", false, err
	}
	_, open := sb.View.Forward(fid)
	return sb.Phase, open, nil
}

func (s sandboxes) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	return s.svc.Dial(ctx, id, port)
}

var _ forward.Activity = sandboxes{}

// Active records bytes through a forward of sandbox id as its activity
// (sandbox.active, source forward, actor "forward").
func (s sandboxes) Active(ctx context.Context, id string, at time.Time) error {
	return s.svc.Active(ctx, id, events.ActiveForward, "forward", at)
}

// viewAdapter is the KV view as the gateway reads it; its waits and
// watches come from the follower f.
type viewAdapter struct {
	v *kvview.View
	f *kvview.Follower
}

func (a viewAdapter) Get(ctx context.Context, id string) (events.View, error) {
	return a.v.Get(ctx, id)
}
func (a viewAdapter) Wait(ctx context.Context, id string, p events.Phase, after uint64) (events.View, error) {
	return a.f.Wait(ctx, id, p, after)
}
func (a viewAdapter) Settle(ctx context.Context, id string, after uint64) (events.View, error) {
	return a.f.Settle(ctx, id, after)
}
func (a viewAdapter) Counts(ctx context.Context) (map[events.Phase]int, error) {
	return a.v.Counts(ctx)
}
func (a viewAdapter) Watch(ctx context.Context, after uint64) (<-chan events.View, error) {
	return a.f.Watch(ctx, after)
}
func (a viewAdapter) List(ctx context.Context, q gateway.ListQuery) (events.Page, error) {
	return a.v.List(ctx, kvview.Query{Phase: q.Phase, Label: q.Label, Name: q.Name, Driver: q.Driver, Node: q.Node,
		Sort: q.Sort, Limit: q.Limit, Cursor: q.Cursor})
}

var _ gateway.Views = viewAdapter{}

// Store is the node's event store (the log on its NATS).
func (a *Node) Store() *jsstore.Store { return a.store }

// Service is the node's command service.
func (a *Node) Service() *gateway.Service { return a.svc }

// Projection is the runner of the node's KV view.
func (a *Node) Projection() *projections.Runner { return a.proj }

// Conn is the node's own NATS connection (the service's user).
func (a *Node) Conn() *nats.Conn { return a.nc }

// Auth is the bus's operator and accounts when the node holds their keys
// (<data>/auth), else nil.
func (a *Node) Auth() *busauth.Auth { return a.auth }

// Name is the node's name (the sandboxes it drives are on it).
func (a *Node) Name() string { return a.name }

// Data is the node's data directory.
func (a *Node) Data() string { return a.data }

// AdminMinted says this start minted the admin token of <data>/admin.token.
func (a *Node) AdminMinted() bool { return a.adminMinted }

// SQLLag is how many events of the log the SQL view has yet to apply
// (FAILED_PRECONDITION without --projection-db).
func (a *Node) SQLLag(ctx context.Context) (uint64, error) {
	if a.sql == nil {
		return 0, events.Errorf(events.CodeFailedPrecondition, "no SQL view (--projection-db)")
	}
	return a.sql.Lag(ctx)
}

// Sim is the node's sim driver (its calls, for tests).
func (a *Node) Sim() *sim.Driver { return a.driver }

// The defaults of the settings serve's flags start from.
var (
	// DefaultTokenLimits are each token's limits on one server.
	DefaultTokenLimits = gateway.DefaultTokenLimits
	// DefaultHTTPTimeouts bound slow HTTP clients.
	DefaultHTTPTimeouts = gateway.Timeouts{ReadHeader: gateway.DefaultReadHeaderTimeout, Read: gateway.DefaultReadTimeout, Write: gateway.DefaultWriteTimeout, Idle: gateway.DefaultIdleTimeout}
)

// DefaultReplayTTL is how long a view of the past is kept.
const DefaultReplayTTL = kvview.DefaultPastTTL

// ReplayDone is the phase of a replay's last line when the rebuild is done.
const ReplayDone = projections.PhaseDone

// groupCommit is whether the log's appends share their syncs
// (jsstore.Config.GroupCommit): on the embedded server when it syncs every
// write (--fsync always). A server of --nats-url keeps its own sync
// setting, which the node does not know.
func groupCommit(c Config) bool { return c.Fsync == "always" && c.NATSURL == "" }
