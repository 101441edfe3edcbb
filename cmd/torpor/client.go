package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
)

// clientFlags are the flags every client verb shares.
type clientFlags struct {
	server  string
	output  string
	noWait  bool
	timeout time.Duration
	key     string
}

func (f *clientFlags) client() *torpor.Client {
	s := f.server
	if s == "" {
		s = os.Getenv("TORPOR_SERVER")
	}
	if s == "" {
		s = "http://127.0.0.1:8080"
	}
	return torpor.New(s, nil)
}

func (f *clientFlags) print(cmd *cobra.Command, v any) error {
	out := cmd.OutOrStdout()
	if f.output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	switch v := v.(type) {
	case events.View:
		fmt.Fprintln(tw, "ID\tNAME\tPHASE\tGEN\tOUTCOME\tREASON\tSEQ")
		row(tw, v)
	case torpor.Page:
		fmt.Fprintln(tw, "ID\tNAME\tPHASE\tGEN\tOUTCOME\tREASON\tSEQ")
		for _, it := range v.Items {
			row(tw, it)
		}
		if v.Next != "" {
			fmt.Fprintf(tw, "(more: --cursor %s)\n", v.Next)
		}
	case []torpor.Event:
		fmt.Fprintln(tw, "SEQ\tTIME\tTYPE\tPHASE\tACTOR\tCOMMAND\tDATA")
		for _, e := range v {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, e.Time.Format(time.RFC3339), e.Type, e.Phase, e.Actor, e.CommandID, e.Data)
		}
	}
	return nil
}

func row(tw *tabwriter.Writer, v events.View) {
	fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%d\n", v.ID, v.Name, v.Phase, v.Generation, v.LastOutcome, v.Reason, v.Seq)
}

func addClientCmds(root *cobra.Command) {
	f := &clientFlags{}
	pf := root.PersistentFlags()
	pf.StringVar(&f.server, "server", "", "torpor server URL (default $TORPOR_SERVER or http://127.0.0.1:8080)")
	pf.StringVarP(&f.output, "output", "o", "table", "output: table or json")

	lifecycle := func(verb string, target events.Phase) *cobra.Command {
		var (
			restart bool
			node    string
		)
		cmd := &cobra.Command{
			Use:   verb + " ID|NAME",
			Short: verb + " a sandbox, waiting until it is " + string(target) + " unless --no-wait",
			Args:  cobra.ExactArgs(1),
			RunE: f.onSandbox(func(cmd *cobra.Command, c *torpor.Client, id string) (any, error) {
				var (
					v   events.View
					err error
				)
				switch verb {
				case "delete":
					v, err = c.Delete(cmd.Context(), id, f.key)
				case "resume":
					v, err = c.Resume(cmd.Context(), id, torpor.ResumeOptions{RestartIfRestoreFails: restart, Node: node}, f.key)
				default:
					v, err = c.Lifecycle(cmd.Context(), verb, id, restart, f.key)
				}
				if err != nil || f.noWait || v.Phase == target {
					return v, err
				}
				return c.WaitAfter(cmd.Context(), v.ID, target, v.Seq, f.timeout)
			}),
		}
		cmd.Flags().BoolVar(&f.noWait, "no-wait", false, "return once the command is accepted")
		cmd.Flags().DurationVar(&f.timeout, "timeout", 2*time.Minute, "how long to wait for the phase")
		cmd.Flags().StringVar(&f.key, "idempotency-key", "", "makes a retry of this command safe")
		if verb == "resume" {
			cmd.Flags().BoolVar(&restart, "restart-if-restore-fails", false, "cold-start if the retained state is lost")
			cmd.Flags().StringVar(&node, "node", "", "resume on this node rather than the sandbox's, where its driver can move the retained state")
		}
		return cmd
	}
	for _, l := range []struct {
		verb   string
		target events.Phase
	}{{"start", events.PhaseReady}, {"stop", events.PhaseStopped}, {"suspend", events.PhaseSuspended}, {"resume", events.PhaseReady}, {"delete", events.PhaseDeleted}} {
		root.AddCommand(lifecycle(l.verb, l.target))
	}

	var (
		req           torpor.CreateRequest
		opts, labels  []string
		env           []string
		phase, label  string
		limit         int
		cursor, at    string
		after         uint64
		waitFor       string
		createNoWait  bool
		createTimeout time.Duration
		createIdemKey string
	)
	create := &cobra.Command{
		Use:   "create [NAME] [--env K=V…] [-- CMD ARG…]",
		Short: "create a sandbox, waiting until it is ready unless --no-wait; what follows -- is the workload's command (the process driver runs it)",
		Args: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash > 1 || (dash < 0 && len(args) > 1) {
				return fmt.Errorf("create takes one NAME, then -- and the command: got %q", args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				args, req.Command = args[:dash], args[dash:]
			}
			if len(args) == 1 {
				req.Name = args[0]
			}
			var err error
			if req.DriverOptions, err = pairs(opts); err != nil {
				return err
			}
			if req.Labels, err = pairs(labels); err != nil {
				return err
			}
			if req.Env, err = pairs(env); err != nil {
				return err
			}
			c := f.client()
			v, err := c.Create(cmd.Context(), req, createIdemKey)
			if err != nil {
				return err
			}
			if !createNoWait {
				if v, err = c.Wait(cmd.Context(), v.ID, events.PhaseReady, createTimeout); err != nil {
					return err
				}
			}
			return f.print(cmd, v)
		},
	}
	create.Flags().StringVar(&req.Driver, "driver", "", "compute driver (default sim)")
	create.Flags().StringVar(&req.Node, "node", "", "the node to run on (default the service's own; another one the service drives: serve --remote-nodes)")
	create.Flags().StringSliceVar(&opts, "opt", nil, "driver option k=v (repeatable)")
	create.Flags().StringSliceVar(&labels, "label", nil, "label k=v (repeatable)")
	create.Flags().StringArrayVar(&env, "env", nil, "the workload's environment variable K=V (repeatable; a value may hold commas)")
	create.Flags().BoolVar(&createNoWait, "no-wait", false, "return once the create is accepted")
	create.Flags().DurationVar(&createTimeout, "timeout", 2*time.Minute, "how long to wait for ready")
	create.Flags().StringVar(&createIdemKey, "idempotency-key", "", "makes a retry of this create safe")

	get := &cobra.Command{
		Use:   "get ID|NAME",
		Short: "show a sandbox's view (--at SEQ|TIME: what it was then)",
		Args:  cobra.ExactArgs(1),
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
			return f.print(cmd, v)
		},
	}
	get.Flags().StringVar(&at, "at", "", "a sequence number or RFC 3339 time")

	list := &cobra.Command{
		Use:   "list",
		Short: "list sandboxes in creation order",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := f.client().List(cmd.Context(), phase, label, limit, cursor)
			if err != nil {
				return err
			}
			return f.print(cmd, p)
		},
	}
	list.Flags().StringVar(&phase, "phase", "", "only this phase")
	list.Flags().StringVar(&label, "label", "", "only sandboxes with label k=v")
	list.Flags().IntVar(&limit, "limit", 0, "page size")
	list.Flags().StringVar(&cursor, "cursor", "", "the next page's cursor")

	history := &cobra.Command{
		Use:   "history ID|NAME",
		Short: "the audit history of a sandbox, from the log",
		Args:  cobra.ExactArgs(1),
		RunE: f.onSandbox(func(cmd *cobra.Command, c *torpor.Client, id string) (any, error) {
			return c.History(cmd.Context(), id, after)
		}),
	}
	history.Flags().Uint64Var(&after, "after", 0, "only events after this sequence")

	wait := &cobra.Command{
		Use:   "wait ID|NAME --for PHASE",
		Short: "wait until a sandbox reaches a phase",
		Args:  cobra.ExactArgs(1),
		RunE: f.onSandbox(func(cmd *cobra.Command, c *torpor.Client, id string) (any, error) {
			return c.Wait(cmd.Context(), id, events.Phase(waitFor), createTimeout)
		}),
	}
	wait.Flags().StringVar(&waitFor, "for", "ready", "the phase to wait for")
	wait.Flags().DurationVar(&createTimeout, "timeout", 2*time.Minute, "how long to wait")

	var tail int
	logs := &cobra.Command{
		Use:   "logs ID|NAME",
		Short: "the last lines of a sandbox's workload output (a process's stdout and stderr, a VM's console)",
		Args:  cobra.ExactArgs(1),
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
	logs.Flags().IntVar(&tail, "tail", 100, "how many lines")

	root.AddCommand(create, get, list, history, wait, logs, checkCmd(f), replayCmd(f))
}

// onSandbox is the RunE of a verb on one sandbox, named by id or name: it
// resolves the id, runs do and prints what do returns.
func (f *clientFlags) onSandbox(do func(cmd *cobra.Command, c *torpor.Client, id string) (any, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c := f.client()
		id, err := resolve(cmd, c, args[0])
		if err != nil {
			return err
		}
		v, err := do(cmd, c, id)
		if err != nil {
			return err
		}
		return f.print(cmd, v)
	}
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
