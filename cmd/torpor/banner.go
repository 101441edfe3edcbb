package main

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/torpor/torpor/services/access"
)

// printBanner says where serve listens and how to reach it: the admin
// token's file and a line to paste.
func printBanner(w io.Writer, a *app, cfg serveConfig) {
	fmt.Fprintf(w, "\ntorpor is up: HTTP on %s, NATS on %s\n", a.HTTPURL(), a.NATSURL())
	auth := ""
	switch {
	case cfg.NoAuth:
		fmt.Fprintln(w, "WARNING: --no-auth: the HTTP API takes every request from loopback without a token")
	case a.AdminToken() != "":
		path := filepath.Join(cfg.Data, access.AdminFile)
		what := "is in"
		if a.AdminMinted() {
			what = "was written to"
		}
		fmt.Fprintf(w, "an admin token %s %s (mode 0600); the CLI in this directory finds it, others take --token or TORPOR_TOKEN\n", what, path)
		fmt.Fprintf(w, "  TOKEN=$(cat %s)\n", path)
		auth = ` -H "Authorization: Bearer $TOKEN"`
	default:
		fmt.Fprintln(w, "no admin token under --data (revoked?): make one with torpor token create, or delete the file and restart")
		auth = ` -H "Authorization: Bearer $TOKEN"`
	}
	if a.Auth() != nil && cfg.Data != "" {
		fmt.Fprintf(w, "the bus takes users of its accounts only (keys under %s): torpor creds --role producer,dashboard -o client.creds, then nats --creds client.creds --inbox-prefix <the inbox it prints> …\n",
			filepath.Join(cfg.Data, "auth"))
	}
	fmt.Fprintf(w, "create a sandbox:\n  curl -s%s -H 'Content-Type: application/json' -X POST %s/v1/sandboxes -d '{\"name\":\"demo\",\"driver\":\"sim\"}'\n\n", auth, a.HTTPURL())
}
