// Package embedded starts a nats-server with JetStream inside this process,
// its store on disk under <data>/jetstream. It is the one place that sets
// the server's options, so that `torpor serve`, the bench and the tests'
// servers lay out and open a data directory the same way.
package embedded

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
)

// Config says where the server keeps its data and whom it serves.
type Config struct {
	// Data is the data directory; the JetStream store is Data/jetstream.
	Data string
	// Listen is the host:port TCP clients reach the server on, port 0 for a
	// random one; empty listens nowhere (in-process connections only).
	Listen string
	// SyncAlways fsyncs every write; otherwise the server syncs
	// periodically, faster, and may lose the last writes on a crash.
	SyncAlways bool
	// Name is the server's name; default "torpor".
	Name string
	// Operator, when set, is the JWT of the operator the server trusts
	// (NATS decentralized auth, internal/busauth): a client must present a
	// user JWT of one of Accounts, and may do what its permissions say.
	// Empty: anyone may connect and do anything (tests' servers only).
	Operator string
	// Accounts are the account JWTs the server knows, by public key
	// (preloaded into a memory resolver); with Operator only.
	Accounts map[string]string
	// SystemAccount is the public key of the system account, one of
	// Accounts; with Operator only.
	SystemAccount string
	// TLS, when set, makes every TCP client speak TLS with the server's
	// certificate in it (in-process connections need not).
	TLS *tls.Config
	// Cluster, when set, is the name of the NATS cluster the server joins
	// (JetStream clustered: streams with replicas); ClusterListen is the
	// host:port it takes routes on (port 0: a random one), Routes the
	// route URLs of the others (nats-route://host:port). Name must then be
	// unique in the cluster. Tests and the bench run three in one process.
	Cluster       string
	ClusterListen string
	Routes        []string
	// ClusterAdvertise, when set, is the host:port the server tells the
	// others to reach its routes on, in place of ClusterListen (a test
	// whose routes go through proxies gives one nothing listens on, so
	// that no server dials another past them).
	ClusterAdvertise string
}

// readyIn bounds the wait for a started server to take connections.
const readyIn = 30 * time.Second

// Validate reports the first field of c the server cannot start with.
func (c Config) Validate() error {
	if _, _, err := c.hostPort(); err != nil {
		return err
	}
	if c.Operator == "" {
		if len(c.Accounts) > 0 || c.SystemAccount != "" {
			return errors.New("accounts without an operator")
		}
		return nil
	}
	if _, ok := c.Accounts[c.SystemAccount]; !ok {
		return errors.New("operator without its system account")
	}
	return nil
}

// auth sets the operator, the accounts and the system account of c on
// opts.
func (c Config) auth(opts *server.Options) error {
	if c.Operator == "" {
		return nil
	}
	op, err := jwt.DecodeOperatorClaims(c.Operator)
	if err != nil {
		return fmt.Errorf("operator: %w", err)
	}
	res := &server.MemAccResolver{}
	for key, tok := range c.Accounts {
		if err := res.Store(key, tok); err != nil {
			return fmt.Errorf("account %s: %w", key, err)
		}
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{op}
	opts.AccountResolver = res
	opts.SystemAccount = c.SystemAccount
	return nil
}

// hostPort is where c listens, with port 0 made server.RANDOM_PORT.
func (c Config) hostPort() (string, int, error) {
	if c.Data == "" {
		return "", 0, errors.New("no data directory")
	}
	if c.Listen == "" {
		return "", 0, nil
	}
	host, portStr, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return "", 0, fmt.Errorf("listen %q: %w", c.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("listen %q: bad port", c.Listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// Start starts the server of cfg and waits until it takes connections.
// The caller shuts it down (Shutdown, then WaitForShutdown).
func Start(cfg Config) (*server.Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	host, port, _ := cfg.hostPort()
	opts := &server.Options{
		ServerName: cfg.Name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		SyncAlways: cfg.SyncAlways,
		NoSigs:     true,
		NoLog:      true,
		DontListen: cfg.Listen == "",
	}
	if err := cfg.auth(opts); err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	if cfg.TLS != nil {
		opts.TLSConfig, opts.TLSTimeout = cfg.TLS, 5
	}
	if err := cfg.cluster(opts); err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	if opts.ServerName == "" {
		opts.ServerName = "torpor"
	}
	dir, err := filepath.Abs(filepath.Join(cfg.Data, "jetstream"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	opts.StoreDir = dir
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats-server: %w", err)
	}
	f := &fatal{said: make(chan string, 1)}
	ns.SetLoggerV2(f, false, false, false)
	ns.Start()
	for end := time.Now().Add(readyIn); ; {
		if ns.ReadyForConnections(50 * time.Millisecond) {
			return ns, nil
		}
		var why string
		select {
		case why = <-f.said:
		default:
			if time.Now().Before(end) {
				continue
			}
			why = fmt.Sprintf("not ready in %s", readyIn)
		}
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("nats-server: %s", why)
	}
}

// fatal is the server's logger: it keeps the first fatal error (a listener
// that cannot bind its port, say), after which the server never gets ready,
// so that Start says why at once rather than after readyIn, and drops the
// rest, as NoLog would.
type fatal struct {
	once sync.Once
	said chan string
}

func (f *fatal) Fatalf(format string, v ...any) {
	f.once.Do(func() { f.said <- fmt.Sprintf(format, v...) })
}
func (f *fatal) Noticef(string, ...any) {}
func (f *fatal) Warnf(string, ...any)   {}
func (f *fatal) Errorf(string, ...any)  {}
func (f *fatal) Debugf(string, ...any)  {}
func (f *fatal) Tracef(string, ...any)  {}

// cluster sets the cluster, its route listener and its routes of c on opts.
func (c Config) cluster(opts *server.Options) error {
	if c.Cluster == "" {
		if c.ClusterListen != "" || len(c.Routes) > 0 {
			return errors.New("routes without a cluster name")
		}
		return nil
	}
	host, portStr, err := net.SplitHostPort(c.ClusterListen)
	if err != nil {
		return fmt.Errorf("cluster listen %q: %w", c.ClusterListen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return fmt.Errorf("cluster listen %q: bad port", c.ClusterListen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts.Cluster = server.ClusterOpts{Name: c.Cluster, Host: host, Port: port, Advertise: c.ClusterAdvertise}
	for _, r := range c.Routes {
		u, err := url.Parse(r)
		if err != nil {
			return fmt.Errorf("route %q: %w", r, err)
		}
		opts.Routes = append(opts.Routes, u)
	}
	return nil
}
