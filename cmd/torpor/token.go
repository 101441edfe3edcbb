package main

// torpor token: make, list and revoke the HTTP API's bearer tokens (admin
// tokens only), and how every client verb finds the token it sends.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor/torpor/events"
	torpor "github.com/torpor/torpor/sdk/go"
	"github.com/torpor/torpor/services/access"
)

// defaultAdminToken is where a client on serve's machine finds the admin
// token of a serve started in the same directory with the default --data.
var defaultAdminToken = filepath.Join("torpor-data", access.AdminFile)

// tokenValue is the bearer token the client verbs send: --token, else
// $TORPOR_TOKEN, else the contents of ./torpor-data/admin.token when that
// file exists; "" when none (the server then answers UNAUTHENTICATED, unless
// it runs with --no-auth).
func (f *clientFlags) tokenValue() string {
	if f.token != "" {
		return f.token
	}
	if t := os.Getenv("TORPOR_TOKEN"); t != "" {
		return t
	}
	if data, err := os.ReadFile(defaultAdminToken); err == nil {
		return strings.TrimSpace(string(data))
	}
	return ""
}

func (f *clientFlags) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "make, list and revoke the HTTP API's bearer tokens (needs an admin token)",
		Args:  cobra.NoArgs,
	}
	var (
		scopes  []string
		expires string
	)
	create := &cobra.Command{
		Use:   "create NAME --scope read|write|admin[,…] [--expires D]",
		Short: "make a token; its secret is printed once (the server keeps a hash)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, err := events.ParseScopes(scopes)
			if err != nil {
				return err
			}
			if expires != "" {
				if _, err := events.ParseExpiry(expires); err != nil {
					return err
				}
			}
			tok, err := f.client().CreateToken(cmd.Context(), torpor.TokenRequest{Name: args[0], Scopes: sc, Expires: expires})
			if err != nil {
				return err
			}
			if f.output == outJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(tok)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok.Token)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s (%s%s): the secret above is shown once; send it as Authorization: Bearer <token>, or TORPOR_TOKEN for the CLI\n",
				tok.Name, joinScopes(tok.Scopes), expiry(tok.TokenInfo))
			return nil
		},
	}
	create.Flags().StringSliceVar(&scopes, "scope", nil, "what the token may do: read, write, admin (admin holds all); repeat or comma-separate")
	create.Flags().StringVar(&expires, "expires", "", "how long the token lasts: a duration (720h) or days (30d); default never")
	list := &cobra.Command{
		Use:   "list",
		Short: "list the tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			items, err := f.client().Tokens(cmd.Context())
			if err != nil {
				return err
			}
			switch f.output {
			case outJSON:
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if items == nil {
					items = []torpor.TokenInfo{}
				}
				return enc.Encode(map[string][]torpor.TokenInfo{"items": items})
			case outName:
				for _, t := range items {
					fmt.Fprintln(cmd.OutOrStdout(), t.Name)
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSCOPES\tCREATED\tEXPIRES\tCREATED BY")
			for _, t := range items {
				exp := "never"
				if t.ExpiresAt != nil {
					exp = t.ExpiresAt.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, joinScopes(t.Scopes), t.CreatedAt.Format(time.RFC3339), exp, t.CreatedBy)
			}
			return tw.Flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke NAME",
		Short: "revoke a token: every server refuses it from then on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.client().RevokeToken(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked\n", args[0])
			return nil
		},
	}
	for _, c := range []*cobra.Command{create, list, revoke} {
		c.ValidArgsFunction = cobra.NoFileCompletions
		cmd.AddCommand(f.verb(c))
	}
	return cmd
}

func joinScopes(s []torpor.Scope) string {
	out := make([]string, len(s))
	for i, sc := range s {
		out[i] = string(sc)
	}
	return strings.Join(out, ",")
}

func expiry(t torpor.TokenInfo) string {
	if t.ExpiresAt == nil {
		return ", no expiry"
	}
	return ", expires " + t.ExpiresAt.Format(time.RFC3339)
}
