package main

// The client verbs: create, get, list, the lifecycle verbs, history, wait,
// logs (watch and top have files of their own), over the SDK's HTTP client.
// Every verb that names a sandbox takes its name or its id and completes
// names from the server; -o table|wide|json|name says how they print.

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// clientFlags are the flags every client verb shares, and what the client
// saw of the network (to say why a server cannot be reached).
type clientFlags struct {
	server string
	output string
	token  string
	ca     string

	mu      sync.Mutex
	dialErr error // the last failure to connect to the server
}

// client is an SDK client of the server (--server, else $TORPOR_SERVER,
// else http://127.0.0.1:8080) with the token of tokenValue, whose failures
// to connect are kept for unreachable.
func (f *clientFlags) client() *torpor.Client {
	return torpor.New(f.serverURL(), f.httpClient()).WithToken(f.tokenValue())
}

// httpClient is the HTTP client of the client verbs: it trusts the CA of
// --ca (else $TORPOR_CA) besides the system's, for a server with
// --tls-cert, and keeps its failures to connect for unreachable.
func (f *clientFlags) httpClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil && ctx.Err() == nil {
			f.mu.Lock()
			f.dialErr = err
			f.mu.Unlock()
		}
		return conn, err
	}
	if pool := f.caPool(); pool != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr}
}

// checkCA refuses a --ca (or $TORPOR_CA) that is no file of PEM
// certificates.
func (f *clientFlags) checkCA() error {
	file := f.ca
	if file == "" {
		file = os.Getenv("TORPOR_CA")
	}
	if file == "" {
		return nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return events.Errorf(events.CodeInvalidArgument, "--ca: %v", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(data) {
		return events.Errorf(events.CodeInvalidArgument, "--ca %s: no PEM certificate in it", file)
	}
	return nil
}

// caPool is the system's roots and the certificates of --ca (else
// $TORPOR_CA), nil when neither names a file (checkCA has refused one that
// cannot be read).
func (f *clientFlags) caPool() *x509.CertPool {
	file := f.ca
	if file == "" {
		file = os.Getenv("TORPOR_CA")
	}
	if file == "" {
		return nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if data, err := os.ReadFile(file); err == nil {
		pool.AppendCertsFromPEM(data)
	}
	return pool
}

// unreachable turns an UNAVAILABLE error that came of a failure to connect
// into one that names the server and how to set it.
func (f *clientFlags) unreachable(err error) error {
	f.mu.Lock()
	dialErr := f.dialErr
	f.mu.Unlock()
	if err == nil || dialErr == nil || events.CodeOf(err) != events.CodeUnavailable {
		return err
	}
	return events.Errorf(events.CodeUnavailable, "cannot reach the torpor server at %s (set it with --server or TORPOR_SERVER): %v", f.serverURL(), dialErr)
}

// verb makes cmd a client verb: -o is checked before it runs, and a server
// it cannot reach is named in the error.
func (f *clientFlags) verb(cmd *cobra.Command) *cobra.Command {
	run := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(f.output); err != nil {
			return err
		}
		if err := f.checkCA(); err != nil {
			return err
		}
		return f.unreachable(run(cmd, args))
	}
	return cmd
}

// show prints one view in the -o format.
func (f *clientFlags) show(cmd *cobra.Command, v events.View) error {
	return printViews(cmd.OutOrStdout(), cmd.ErrOrStderr(), f.output, []events.View{v}, false, "", 1)
}

// clientHelp is the long help of torpor: what the client verbs share, and
// the exit statuses.
const clientHelp = `torpor serve runs the service; the other verbs are its clients (the server is
--server, else $TORPOR_SERVER, else http://127.0.0.1:8080; the token --token, else
$TORPOR_TOKEN, else ./torpor-data/admin.token when present). A sandbox is named
by its name or its id. -o table (default), wide, json or name (names only, one
a line, for xargs). create and the lifecycle verbs wait for their target phase
(--timeout D, default $TORPOR_LIFECYCLE_TIMEOUT or 5m) unless --no-wait.
`

func addClientCmds(root *cobra.Command) {
	f := &clientFlags{}
	root.Long = root.Short + "\n\n" + clientHelp + "\n" + exitHelp()
	pf := root.PersistentFlags()
	pf.StringVar(&f.server, "server", "", "torpor server URL (default $TORPOR_SERVER or http://127.0.0.1:8080)")
	pf.StringVarP(&f.output, "output", "o", outTable, "output: table, wide, json or name")
	pf.StringVar(&f.ca, "ca", "", "a CA certificate (PEM) to trust for an https --server besides the system's (default $TORPOR_CA)")
	pf.StringVar(&f.token, "token", "", "bearer token for the server (default $TORPOR_TOKEN, else ./torpor-data/admin.token when present)")

	for _, l := range []struct {
		verb   string
		target events.Phase
	}{{"start", events.PhaseReady}, {"stop", events.PhaseStopped}, {"suspend", events.PhaseSuspended}, {"resume", events.PhaseReady}, {"delete", events.PhaseDeleted}} {
		root.AddCommand(f.verb(f.lifecycleCmd(l.verb, l.target)))
	}
	check, replay := checkCmd(f), replayCmd(f)
	check.ValidArgsFunction, replay.ValidArgsFunction = f.completeSandboxes(), cobra.NoFileCompletions
	for _, cmd := range []*cobra.Command{f.createCmd(), f.getCmd(), f.listCmd(), f.historyCmd(), f.waitCmd(), f.logsCmd(), f.watchCmd(), f.topCmd(), f.touchCmd(), check, replay} {
		root.AddCommand(f.verb(cmd))
	}
	root.AddCommand(f.tokenCmd())
}

// waitFlags are the flags of a verb that waits.
type waitFlags struct {
	noWait  bool
	timeout time.Duration
	key     string
}

func (w *waitFlags) add(cmd *cobra.Command, what string) {
	cmd.Flags().BoolVar(&w.noWait, "no-wait", false, "return once the "+what+" is accepted (prints the view as accepted)")
	cmd.Flags().DurationVar(&w.timeout, "timeout", 0, "how long to wait for the phase (default $TORPOR_LIFECYCLE_TIMEOUT or 5m)")
	cmd.Flags().StringVar(&w.key, "idempotency-key", "", "makes a retry of this "+what+" safe")
}

func (f *clientFlags) lifecycleCmd(verb string, target events.Phase) *cobra.Command {
	var (
		w       waitFlags
		restart bool
		node    string
		yes     bool
	)
	cmd := &cobra.Command{
		Use:               verb + " ID|NAME",
		Short:             verb + " a sandbox, waiting until it is " + string(target) + " unless --no-wait",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: f.completeSandboxes(completePhases[verb]...),
		RunE: func(cmd *cobra.Command, args []string) error {
			timeout, err := timeoutOf(w.timeout)
			if err != nil {
				return err
			}
			c := f.client()
			ctx := cmd.Context()
			cur, err := c.Get(ctx, args[0])
			if err != nil {
				return err
			}
			if verb == "start" && cur.Phase == events.PhaseSuspended {
				if err := confirmDiscard(cmd, cur, yes); err != nil {
					return err
				}
			}
			var o torpor.ResumeOptions
			if verb == "resume" {
				o = torpor.ResumeOptions{RestartIfRestoreFails: restart, Node: node}
			}
			if !w.noWait {
				// One round trip: the command answers its outcome.
				return f.settle(cmd, c, verb, ref(cur), target, timeout, func(ctx context.Context, d time.Duration) (events.View, error) {
					return c.LifecycleWait(ctx, verb, cur.ID, o, w.key, d)
				})
			}
			var v events.View
			switch verb {
			case "delete":
				v, err = c.Delete(ctx, cur.ID, w.key)
			case "resume":
				v, err = c.Resume(ctx, cur.ID, o, w.key)
			default:
				v, err = c.Lifecycle(ctx, verb, cur.ID, false, w.key)
			}
			if err != nil {
				return err
			}
			return f.show(cmd, v)
		},
	}
	w.add(cmd, verb)
	switch verb {
	case "resume":
		cmd.Flags().BoolVar(&restart, "restart-if-restore-fails", false, "cold-start if the retained state is lost")
		cmd.Flags().StringVar(&node, "node", "", "resume on this node rather than the sandbox's, where its driver can move the retained state")
	case "start":
		cmd.Flags().BoolVarP(&yes, "yes", "y", false, "start a suspended sandbox cold without asking (its retained state is discarded)")
		cmd.Long = "start a stopped sandbox (cold), or a suspended one: that discards its retained state\n" +
			"(resume keeps it), so start asks [y/N] on a terminal first; without a terminal it refuses\n" +
			"(FAILED_PRECONDITION) unless --yes, so a script never hangs on the question nor loses the\n" +
			"state silently. Declining leaves the sandbox suspended and exits with FAILED_PRECONDITION's status."
	}
	return cmd
}

// confirmDiscard asks before a start of the suspended sandbox v discards
// its retained state: yes proceeds with a warning; on a terminal (stdin)
// the user answers [y/N]; with no terminal it is refused.
func confirmDiscard(cmd *cobra.Command, v events.View, yes bool) error {
	errOut := cmd.ErrOrStderr()
	if yes {
		fmt.Fprintf(errOut, "warning: %s is suspended: start discards its retained state and starts it cold\n", ref(v))
		return nil
	}
	in := cmd.InOrStdin()
	if !terminal(in) {
		return events.Errorf(events.CodeFailedPrecondition, "start %s: it is suspended, and start discards its retained state (resume keeps it); with no terminal to confirm on, pass --yes to start it cold", ref(v))
	}
	fmt.Fprintf(errOut, "%s is suspended: start discards its retained state and starts it cold (resume keeps it).\nStart %s cold? [y/N] ", ref(v), ref(v))
	line, _ := bufio.NewReader(in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return events.Errorf(events.CodeFailedPrecondition, "start %s: not confirmed; it stays suspended, its retained state kept", ref(v))
}

func (f *clientFlags) createCmd() *cobra.Command {
	var (
		w                 waitFlags
		req               torpor.CreateRequest
		opts, labels, env []string
		idle              events.IdlePolicy
	)
	cmd := &cobra.Command{
		Use:   "create [NAME] [--env K=V…] [-- CMD ARG…]",
		Short: "create a sandbox, waiting until it is ready unless --no-wait; what follows -- is the workload's command (the process driver runs it)",
		Args: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash > 1 || (dash < 0 && len(args) > 1) {
				return fmt.Errorf("create takes one NAME, then -- and the command: got %q", args)
			}
			return nil
		},
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			timeout, err := timeoutOf(w.timeout)
			if err != nil {
				return err
			}
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				args, req.Command = args[:dash], args[dash:]
			}
			if len(args) == 1 {
				req.Name = args[0]
			}
			if req.DriverOptions, err = pairs(opts); err != nil {
				return err
			}
			if req.Labels, err = pairs(labels); err != nil {
				return err
			}
			if req.Env, err = pairs(env); err != nil {
				return err
			}
			if idle.After != "" || idle.Action != "" || idle.Fallback != "" {
				req.Idle = &idle // the server checks it
			}
			c := f.client()
			if !w.noWait {
				// One round trip: the create answers the sandbox settled.
				return f.settle(cmd, c, "create", cmp.Or(req.Name, "a sandbox"), events.PhaseReady, timeout, func(ctx context.Context, d time.Duration) (events.View, error) {
					return c.CreateWait(ctx, req, w.key, d)
				})
			}
			v, err := c.Create(cmd.Context(), req, w.key)
			if err != nil {
				return err
			}
			return f.show(cmd, v)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&req.Driver, "driver", "", "compute driver (default sim)")
	fl.StringVar(&req.Node, "node", "", "the node to run on (default the service's own; another one the service drives: serve --remote-nodes)")
	fl.StringSliceVar(&opts, "opt", nil, "driver option k=v (repeatable)")
	fl.StringSliceVar(&labels, "label", nil, "label k=v (repeatable)")
	fl.StringArrayVar(&env, "env", nil, "the workload's environment variable K=V (repeatable; a value may hold commas)")
	fl.StringVar(&req.TTL, "ttl", "", "time to live (2h45m): then --on-expiry")
	fl.StringVar(&req.ExpiresAt, "expires-at", "", "when it expires, RFC 3339 (instead of --ttl)")
	fl.StringVar(&req.OnExpiry, "on-expiry", "", "what its expiry does: delete (default) or stop")
	fl.StringVar(&req.RetainFor, "retain-for", "", "how long a retained state is held from its suspension (default the server's --retain-for)")
	fl.BoolVar(&req.TTLPausesWhileSuspended, "ttl-pauses-while-suspended", false, "time spent suspended moves its expiry later (with --ttl or --expires-at)")
	fl.BoolVar(&req.WakeOnTraffic, "wake-on-traffic", false, "a connection to one of its forwards while it is suspended resumes it")
	fl.StringVar(&idle.After, "idle-after", "", "idle policy: suspend (or stop) it once ready with no activity this long (default the server's --idle-after)")
	fl.StringVar(&idle.Action, "idle-action", "", "what its idle policy does: suspend (default) or stop")
	fl.StringVar(&idle.Fallback, "idle-fallback", "", "what its idle policy does when the driver cannot suspend: none (default) or stop")
	w.add(cmd, "create")
	return cmd
}

func (f *clientFlags) getCmd() *cobra.Command {
	var at string
	cmd := &cobra.Command{
		Use:               "get ID|NAME",
		Short:             "show a sandbox's view (--at SEQ|TIME: what it was then)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: f.completeSandboxes(),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := f.client()
			var (
				v   events.View
				err error
			)
			if at != "" {
				v, err = c.GetAt(cmd.Context(), args[0], at)
			} else {
				v, err = c.Get(cmd.Context(), args[0])
			}
			if err != nil {
				return err
			}
			return f.show(cmd, v)
		},
	}
	cmd.Flags().StringVar(&at, "at", "", "a sequence number or RFC 3339 time")
	return cmd
}

func (f *clientFlags) listCmd() *cobra.Command {
	var (
		o      torpor.ListOptions
		labels []string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "list sandboxes, in creation order unless --sort (every page, unless --limit or --cursor asks for one)",
		Long: "list sandboxes, in creation order unless --sort says name, -name, age (the longest in its\n" +
			"phase first) or -age. -l k=v (repeatable) keeps those with every label given: the server\n" +
			"filters on one of them, the others are filtered here, so a page of --limit N can come back\n" +
			"with fewer than N (and -o json's total counts the first label only). --name keeps names\n" +
			"that contain it, in any case. Without --limit or --cursor every page is read.",
		Args:              cobra.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lf, err := parseLabels(labels)
			if err != nil {
				return err
			}
			c := f.client()
			one := o.Limit > 0 || o.Cursor != ""
			o.Label = lf.server()
			var views []events.View
			total := 0
			for {
				p, err := c.ListWith(cmd.Context(), o)
				if err != nil {
					return err
				}
				for _, v := range p.Items {
					if lf.match(v) {
						views = append(views, v)
					}
				}
				o.Cursor, total = p.Next, p.Total
				if one || o.Cursor == "" {
					break
				}
			}
			if !one {
				total = len(views)
			}
			return printViews(cmd.OutOrStdout(), cmd.ErrOrStderr(), f.output, views, true, o.Cursor, total)
		},
	}
	cmd.Flags().StringVar(&o.Phase, "phase", "", "only this phase")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label k=v (repeatable: all of them)")
	cmd.Flags().StringVar(&o.Name, "name", "", "only names that contain this, in any case")
	cmd.Flags().StringVar(&o.Driver, "driver", "", "only this driver")
	cmd.Flags().StringVar(&o.Node, "node", "", "only this node")
	cmd.Flags().StringVar(&o.Sort, "sort", "", "created (default), name, -name, age (longest in phase first) or -age")
	cmd.Flags().IntVar(&o.Limit, "limit", 0, "one page of this size")
	cmd.Flags().StringVar(&o.Cursor, "cursor", "", "the page at this cursor (of a list of the same --sort)")
	return cmd
}

func (f *clientFlags) historyCmd() *cobra.Command {
	var after uint64
	cmd := &cobra.Command{
		Use:               "history ID|NAME",
		Short:             "the audit history of a sandbox, from the log",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: f.completeSandboxes(),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := f.client()
			id, err := resolve(cmd, c, args[0])
			if err != nil {
				return err
			}
			h, err := c.History(cmd.Context(), id, after)
			if err != nil {
				return err
			}
			return printHistory(cmd.OutOrStdout(), f.output, h)
		},
	}
	cmd.Flags().Uint64Var(&after, "after", 0, "only events after this sequence")
	return cmd
}

func (f *clientFlags) waitCmd() *cobra.Command {
	var (
		phase   string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:               "wait ID|NAME --for PHASE",
		Short:             "wait until a sandbox reaches a phase (FAILED_PRECONDITION once it is in another terminal one)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: f.completeSandboxes(),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := timeoutOf(timeout)
			if err != nil {
				return err
			}
			if !events.Phase(phase).Known() {
				return events.Errorf(events.CodeInvalidArgument, "--for %q: want one of %v", phase, events.Phases)
			}
			c := f.client()
			v, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if v, err = waitSettled(cmd.Context(), c, "wait", v.ID, events.Phase(phase), nil, 0, d); err != nil {
				return err
			}
			return f.show(cmd, v)
		},
	}
	cmd.Flags().StringVar(&phase, "for", "ready", "the phase to wait for")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "how long to wait (default $TORPOR_LIFECYCLE_TIMEOUT or 5m)")
	return cmd
}

func (f *clientFlags) logsCmd() *cobra.Command {
	var tail int
	cmd := &cobra.Command{
		Use:               "logs ID|NAME",
		Short:             "the last lines of a sandbox's workload output (a process's stdout and stderr, a VM's console)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: f.completeSandboxes(),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := f.client()
			id, err := resolve(cmd, c, args[0])
			if err != nil {
				return err
			}
			out, err := c.Logs(cmd.Context(), id, tail)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().IntVar(&tail, "tail", 100, "how many lines")
	return cmd
}

// resolve turns a name into an id (the HTTP API takes ids on commands); an
// id is passed through.
func resolve(cmd *cobra.Command, c *torpor.Client, ref string) (string, error) {
	if _, err := uuid.Parse(ref); err == nil {
		return ref, nil
	}
	v, err := c.Get(cmd.Context(), ref)
	if err != nil {
		return "", err
	}
	return v.ID, nil
}

// pairs parses k=v flags.
func pairs(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, events.Errorf(events.CodeInvalidArgument, "%q: want key=value", kv)
		}
		m[k] = v
	}
	return m, nil
}

// canceled says whether err is the end of ctx (a ^C), which ends a verb
// that runs until then (watch, top) successfully.
func canceled(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || events.CodeOf(err) == events.CodeUnavailable || err == nil)
}
