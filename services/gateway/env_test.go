package gateway

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/torpor/torpor/events"
	"github.com/torpor/torpor/services/compute"
)

// TestEnvNotInTheLogInClear: a create's env values are nowhere in the log
// (nor in the history built from it): sandbox.created names the variables
// with "(secret)" and carries the values sealed, which the service's
// credentials open for that sandbox only.
func TestEnvNotInTheLogInClear(t *testing.T) {
	r := newRig(t)
	svc := r.service(t)
	ctx := context.Background()
	secret := "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	env := map[string]string{"AWS_SECRET_ACCESS_KEY": secret, "A": "1"}
	v, err := svc.Handle(ctx, Command{Verb: VerbCreate, Create: events.CreateRequest{Env: maps.Clone(env)}})
	if err != nil {
		t.Fatal(err)
	}
	envs, err := svc.History(ctx, v.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range envs {
		if strings.Contains(string(e.Data), secret) {
			t.Fatalf("the log holds the secret in clear: %s", e.Data)
		}
	}
	created, err := envs[0].Decode()
	if err != nil {
		t.Fatal(err)
	}
	c := created.(*events.Created)
	if want := map[string]string{"AWS_SECRET_ACCESS_KEY": compute.EnvRedacted, "A": compute.EnvRedacted}; !maps.Equal(c.Env, want) {
		t.Errorf("created env %v, want %v", c.Env, want)
	}
	if got, err := r.creds.OpenEnv(v.ID, c); err != nil || !maps.Equal(got, env) {
		t.Errorf("opened env %v, %v; want %v", got, err, env)
	}
	if _, err := r.creds.OpenEnv("0193b0a4-0000-7000-8000-0000000000ff", c); err == nil {
		t.Error("the seal opened for another sandbox")
	}
	other, _ := compute.NewCredentials([]byte("another secret, another service!"))
	if _, err := other.OpenEnv(v.ID, c); err == nil {
		t.Error("the seal opened under another service's key")
	}
	tampered := *c
	tampered.EnvSealed = "A" + c.EnvSealed[1:]
	if c.EnvSealed[0] == 'A' {
		tampered.EnvSealed = "B" + c.EnvSealed[1:]
	}
	if _, err := r.creds.OpenEnv(v.ID, &tampered); err == nil {
		t.Error("a tampered seal opened")
	}
}
