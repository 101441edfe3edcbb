package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/torpor/torpor/internal/busauth"
)

// credsConfig is everything `torpor creds` takes from its flags.
type credsConfig struct {
	Roles []string
	Node  string
	Data  string
	Out   string
	Name  string
	// ServerConfig is where to write the nats-server configuration of
	// the bus's operator and accounts (--server-config), for a server run
	// apart (deploy/nats).
	ServerConfig string
	// Revoke is a credentials file whose user to revoke (--revoke).
	Revoke string
	// SimReports lets a driver report for sandboxes, as the sim driver of
	// a driver node does (--sim-reports, busauth.Grant.SimReports).
	SimReports bool
}

// credsCmd is `torpor creds`: it mints a user of the bus under the keys in
// <data>/auth and writes its NATS credentials file (mode 0600), what
// `--nats-creds`, nats.go's UserCredentials and `nats --creds` read.
func credsCmd() *cobra.Command {
	cfg := credsConfig{}
	roles := make([]string, 0, len(busauth.Roles))
	for _, r := range busauth.Roles {
		roles = append(roles, string(r))
	}
	cmd := &cobra.Command{
		Use:   "creds --role ROLE[,ROLE] [--node N [--sim-reports]] [--data DIR] -o FILE",
		Short: "write a NATS credentials file for a user of the bus with the given roles (" + strings.Join(roles, ", ") + ")",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Revoke != "" {
				pub, err := revokeCreds(cfg)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "revoked user %s: a running serve with an embedded NATS on this --data refuses it within a second, closing its connections (a nats-server run apart: write its auth.conf again with --server-config and reload it)\n", pub)
				return nil
			}
			if cfg.ServerConfig != "" {
				if err := writeServerConfig(cfg); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (include it from the nats-server's configuration)\n", cfg.ServerConfig)
				if len(cfg.Roles) == 0 && cfg.Out == "" {
					return nil
				}
			}
			inbox, err := writeCreds(cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (roles %s)\n", cfg.Out, strings.Join(cfg.Roles, ","))
			if inbox != busauth.DefaultInbox && strings.HasPrefix(inbox, busauth.DefaultInbox) {
				fmt.Fprintf(cmd.OutOrStdout(), "its answers come on its own inbox: nats --creds %s --inbox-prefix %s …; in Go, nats.Connect(url, torpor.Credentials(%q))\n", cfg.Out, inbox, cfg.Out)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Roles, "role", nil, "the user's roles: "+strings.Join(roles, ", ")+" (several: the union of their permissions)")
	f.StringVar(&cfg.Node, "node", "", "with --role driver: the node whose drivers it serves")
	f.BoolVar(&cfg.SimReports, "sim-reports", false, "with --role driver: let it report for sandboxes (torpor.supervisor.*), which the sim driver of `torpor driver --drivers sim` does for its own; the process and vm drivers need it not")
	f.StringVar(&cfg.Data, "data", "./torpor-data", "the data directory of the service whose bus keys (auth/) sign the user")
	f.StringVarP(&cfg.Out, "output", "o", "", "the file to write (mode 0600; an existing file is replaced)")
	f.StringVar(&cfg.Name, "name", "", "the user's name in its JWT; default: its roles")
	f.StringVar(&cfg.Revoke, "revoke", "", "revoke the user of this credentials file (kept in <data>/auth/revoked) instead of minting one")
	f.StringVar(&cfg.ServerConfig, "server-config", "", "also (or only) write the nats-server configuration that trusts this bus's operator and accounts, to include from a server run apart (deploy/nats)")
	return cmd
}

// writeCreds mints cfg's user and writes its credentials file; it returns
// the user's inbox prefix.
func writeCreds(cfg credsConfig) (string, error) {
	grants, err := busauth.ParseRoles(cfg.Roles, cfg.Node, cfg.SimReports)
	if err != nil {
		return "", invalid(fmt.Errorf("--role: %w", err))
	}
	if cfg.Out == "" {
		return "", invalid(errors.New("-o: want the file to write"))
	}
	if cfg.Data == "" {
		return "", invalid(errors.New("--data: want the service's data directory"))
	}
	auth, err := busauth.Open(filepath.Join(cfg.Data, "auth"), busauth.NoLimits)
	if err != nil {
		return "", invalid(err)
	}
	name := cfg.Name
	if name == "" {
		name = strings.Join(cfg.Roles, ",")
	}
	u, err := auth.User(name, 0, grants...)
	if err != nil {
		return "", err
	}
	creds, err := u.Creds()
	if err != nil {
		return "", err
	}
	return u.Inbox, writePrivate(cfg.Out, "-o", creds)
}

// revokeCreds revokes the user of the credentials file cfg.Revoke and
// returns its public key.
func revokeCreds(cfg credsConfig) (string, error) {
	b, err := os.ReadFile(cfg.Revoke)
	if err != nil {
		return "", invalid(fmt.Errorf("--revoke: %w", err))
	}
	auth, err := busauth.Open(filepath.Join(cfg.Data, "auth"), busauth.NoLimits)
	if err != nil {
		return "", invalid(err)
	}
	pub, err := auth.Revoke(b)
	if err != nil {
		return "", invalid(fmt.Errorf("--revoke %s: %w", cfg.Revoke, err))
	}
	return pub, nil
}

// writeServerConfig writes the nats-server configuration of cfg's bus.
func writeServerConfig(cfg credsConfig) error {
	if cfg.Data == "" {
		return invalid(errors.New("--data: want the service's data directory"))
	}
	auth, err := busauth.Open(filepath.Join(cfg.Data, "auth"), busauth.NoLimits)
	if err != nil {
		return invalid(err)
	}
	return writePrivate(cfg.ServerConfig, "--server-config", auth.ServerConfig())
}

// writePrivate writes data to path, mode 0600 from the start: beside it,
// then renamed over it.
func writePrivate(path, flag string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".creds-*")
	if err != nil {
		return invalid(fmt.Errorf("%s: %w", flag, err))
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
