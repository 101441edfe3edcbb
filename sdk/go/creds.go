package torpor

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
)

// Credentials connects as the user of a credentials file that `torpor creds`
// wrote: nats.UserCredentials(path), and, for a producer or dashboard, the
// inbox prefix that user must read its answers on (each client has one of
// its own, which no other client may read). Pass it to nats.Connect:
//
//	nc, err := nats.Connect(url, torpor.Credentials("client.creds"))
func Credentials(path string) nats.Option {
	return func(o *nats.Options) error {
		if err := nats.UserCredentials(path)(o); err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		inbox, err := credsInbox(b)
		if err != nil || inbox == "" {
			return err
		}
		return nats.CustomInboxPrefix(inbox)(o)
	}
}

// credsInbox is the inbox prefix the user of a credentials file must use:
// "_INBOX_" and the last 20 characters of its public key when its
// permissions allow it that inbox only (torpor's clients), else "". The
// service mints it so (internal/busauth.ClientInbox); the SDK reads the
// user JWT's claims itself, to depend on nothing of the service.
func credsInbox(creds []byte) (string, error) {
	text := string(creds)
	const begin = "-----BEGIN NATS USER JWT-----"
	i := strings.Index(text, begin)
	if i < 0 {
		return "", fmt.Errorf("credentials: no user JWT")
	}
	rest := strings.TrimSpace(text[i+len(begin):])
	tok, _, _ := strings.Cut(rest, "\n")
	parts := strings.Split(strings.TrimSpace(tok), ".")
	if len(parts) != 3 {
		return "", fmt.Errorf("credentials: the user JWT is not one")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", fmt.Errorf("credentials: %w", err)
	}
	var claims struct {
		Sub  string `json:"sub"`
		NATS struct {
			Sub struct {
				Allow []string `json:"allow"`
			} `json:"sub"`
		} `json:"nats"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return "", fmt.Errorf("credentials: %w", err)
	}
	own := "_INBOX_" + claims.Sub[max(0, len(claims.Sub)-20):]
	if slices.Contains(claims.NATS.Sub.Allow, own+".>") {
		return own, nil
	}
	return "", nil
}
