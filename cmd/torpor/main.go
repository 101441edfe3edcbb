// Command torpor is the one binary of torpor: `torpor serve` runs the service
// (embedded NATS, gateway, sagas, the KV phase view, HTTP); the other verbs are
// a client of a running server. This is the only package that reads flags and
// the environment and wires the others together.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/events/jsstore"
	"github.com/torpor/torpor/services/node"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs one invocation of torpor and returns its exit status: 0 on
// success, else "torpor: CODE: message" on stderr and the status of that
// code (exitStatuses).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	ran := false
	root := rootCmd()
	root.PersistentPreRun = func(*cobra.Command, []string) { ran = true }
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	e := events.AsError(err)
	var ce *events.Error
	if !ran && !errors.As(err, &ce) {
		// cobra refused the flags or arguments before any verb ran.
		e = events.Errorf(events.CodeInvalidArgument, "%v", err)
	}
	fmt.Fprintf(stderr, "torpor: %s: %s\n", e.Code, e.Message)
	return exitStatus(e.Code)
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "torpor",
		Short:         "torpor: suspend and resume compute sandboxes without lying about their state",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), driverCmd(), benchCmd(), superviseCmd(), superviseExecCmd(), credsCmd())
	addClientCmds(root)
	return root
}

// defaultHeartbeatLimit is serve's --heartbeat-limit default, which the
// bench's service runs with too.
const defaultHeartbeatLimit = 15 * time.Second

func serveCmd() *cobra.Command {
	cfg := serveConfig{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "run the service on an embedded NATS server (or --nats-url)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly}).With().Timestamp().Logger()
			if cfg.NATSURL != "" && cmd.Flags().Changed("fsync") {
				log.Warn().Str("fsync", cfg.Fsync).Msg("--fsync sets the embedded server only: the servers of --nats-url sync as their own sync_interval says")
			}
			a, err := start(cmd.Context(), cfg, log)
			if err != nil {
				return err
			}
			log.Info().Str("http", a.HTTPAddr()).Str("nats", a.NATSURL()).Str("data", cfg.Data).Str("fsync", cfg.Fsync).Str("node", cfg.Node).Msg("torpor serving")
			printBanner(os.Stderr, a, cfg)
			err = a.Wait()
			log.Info().Err(err).Msg("torpor stopped")
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Data, "data", "./torpor-data", "directory of the embedded JetStream store")
	f.StringVar(&cfg.HTTP, "http", "127.0.0.1:8080", "HTTP listen address")
	f.StringVar(&cfg.NATSListen, "nats-listen", "127.0.0.1:4222", "where the embedded NATS server listens for producers")
	f.StringVar(&cfg.NATSURL, "nats-url", "", "join an existing NATS cluster instead of embedding one")
	f.StringVar(&cfg.NATSCreds, "nats-creds", "", "with --nats-url: the NATS credentials file to connect with (`torpor creds --role service`)")
	f.IntVar(&cfg.Replicas, "replicas", 0, "copies the NATS cluster keeps of the log, every bucket and the object store (1 to 5); default: what the existing streams have, 1 on a new bus (the embedded server: 1)")
	f.BoolVar(&cfg.RaiseReplicas, "raise-replicas", false, "raise the streams that have fewer than --replicas (without it a start refuses them)")
	f.StringVar(&cfg.NATSCA, "nats-ca", "", "a PEM file of CAs that torpor's NATS clients (its connection, its supervisors) trust besides the system's; default with --tls-cert: that certificate")
	f.StringVar(&cfg.Fsync, "fsync", "always", "the embedded server's sync: always: fsync every write; interval: fsync periodically (faster, may lose the last writes on a crash); with --nats-url the servers' own sync_interval decides, not this flag")
	f.StringVar(&cfg.Node, "node", "local", "the node this service runs sandboxes for")
	f.DurationVar(&cfg.Deadline, "deadline", 2*time.Minute, "deadline of every transient phase")
	f.StringSliceVar(&cfg.RemoteNodes, "remote-nodes", nil, "other nodes this service drives, through their `torpor driver --node N` on the bus (a create or a resume may name one)")
	f.StringVar(&cfg.VMKernel, "vm-kernel", "", "the guest kernel of the vm driver (deploy/vm-kernel fetches Debian's cloud kernel); default $TORPOR_VM_KERNEL")
	f.DurationVar(&cfg.HeartbeatLimit, "heartbeat-limit", defaultHeartbeatLimit, "how long a supervisor that heartbeats may fall silent before it is recorded detached (process supervisors beat three times within it)")
	f.DurationVar(&cfg.RetainFor, "retain-for", 0, "how long a retained state is held from its suspension when a create names no retain_for; past it the sandbox is stopped (0: kept for ever)")
	f.IntVar(&cfg.WakeMaxHeld, "wake-max-held", 64, "how many connections to the forwards of one suspended sandbox with wake_on_traffic are held at once while it resumes; one more is refused at once")
	f.DurationVar(&cfg.WakeTimeout, "wake-timeout", 30*time.Second, "how long a connection to a forward of a suspended sandbox with wake_on_traffic is held for its resume before it is refused")
	cfg.ActivityWindow = node.DefaultActivityWindow
	f.Var(positiveDuration{&cfg.ActivityWindow}, "activity-window", "a sandbox's activity (a touch, bytes through its forwards) is recorded at most once per window (sandbox.active)")
	f.DurationVar(&cfg.IdleAfter, "idle-after", 0, "the idle policy of a create that names none: a sandbox ready with no activity this long is suspended or stopped (sandbox.idle_timeout; 0: no idle policy)")
	f.StringVar(&cfg.IdleAction, "idle-action", "", "what the default idle policy does: suspend (the default) or stop")
	f.StringVar(&cfg.IdleFallback, "idle-fallback", "", "what the default idle policy does to a sandbox whose driver cannot suspend: none (the default: left running) or stop")
	f.StringVar(&cfg.ProjectionDB, "projection-db", "", "also keep the SQL view in this CockroachDB or PostgreSQL database (postgresql://user@host:26257/torpor?sslmode=verify-full); a database that is down delays the view, not the service")
	f.StringVar(&cfg.ReadFrom, "read-from", "kv", "the view that lists, gets, counts and histories are read from: kv, or sql (wants --projection-db); waits and watches read kv")
	f.BoolVar(&cfg.NoAuth, "no-auth", false, "serve the HTTP API without tokens, every request with every scope (loopback --http only; warned of at every start)")
	f.StringSliceVar(&cfg.HTTPHosts, "http-host", nil, "names, besides IP addresses and localhost, that requests may address the HTTP API by (a Host it does not answer for is refused)")
	f.StringSliceVar(&cfg.CORSOrigins, "cors-origin", nil, "browser origins allowed to call the HTTP API across origins (none by default)")
	f.BoolVar(&cfg.MetricsOpen, "metrics-open", false, "serve /metrics without a token (it wants a read token otherwise)")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "serve the HTTP API over TLS with this certificate (PEM; with --tls-key)")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "the private key of --tls-cert (PEM)")
	cfg.TokenLimits = node.DefaultTokenLimits
	f.Float64Var(&cfg.TokenLimits.Rate, "token-rate", cfg.TokenLimits.Rate, "requests a second each token may send to this server on average (0: no limit); past it RESOURCE_EXHAUSTED")
	f.IntVar(&cfg.TokenLimits.Burst, "token-burst", cfg.TokenLimits.Burst, "requests each token may send at once above --token-rate")
	f.IntVar(&cfg.TokenLimits.Watches, "token-watches", cfg.TokenLimits.Watches, "watches each token may hold open on this server (0: no limit)")
	f.IntVar(&cfg.TokenLimits.Waits, "token-waits", cfg.TokenLimits.Waits, "waits each token may hold open on this server (0: no limit)")
	f.IntVar(&cfg.TokenLimits.Sandboxes, "token-sandboxes", cfg.TokenLimits.Sandboxes, "sandboxes each token may have made and not deleted, on every server together (0: no limit)")
	f.StringVar(&cfg.RunAs, runAsFlag, "", runAsUsage)
	f.Int64Var(&cfg.MaxLogBytes, "max-log-bytes", jsstore.DefaultMaxBytes, "storage bound of the event log (the server reserves it); a full log refuses commands RESOURCE_EXHAUSTED, never drops events; -1: no bound")
	f.DurationVar(&cfg.ReplayTTL, "replay-ttl", node.DefaultReplayTTL, "how long a view rebuilt for the past (torpor replay --until: bucket torpor_phases_at_<seq>, tables torpor_sandboxes_at_<seq> and torpor_history_at_<seq>) is kept before it is removed")
	cfg.HTTPTimeouts = node.DefaultHTTPTimeouts
	f.Var(positiveDuration{&cfg.HTTPTimeouts.ReadHeader}, "http-read-header-timeout", "how long an HTTP client may take to send a request's header")
	f.Var(positiveDuration{&cfg.HTTPTimeouts.Read}, "http-read-timeout", "how long an HTTP client may take to send a whole request, its body included")
	f.Var(positiveDuration{&cfg.HTTPTimeouts.Write}, "http-write-timeout", "how long an HTTP answer may take (watch, wait and replay stream past it)")
	f.Var(positiveDuration{&cfg.HTTPTimeouts.Idle}, "http-idle-timeout", "how long a kept-alive HTTP connection may wait idle for its next request")
	f.DurationVar(&cfg.DuplicateWindow, "duplicate-window", jsstore.DefaultDuplicateWindow, "how long the event stream remembers message ids for deduplication (about 125 bytes of server heap per append for that long)")
	return cmd
}
