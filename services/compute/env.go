package compute

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/torpor/torpor/events"
)

// EnvRedacted stands for every env value in the log: sandbox.created names
// the variables, and their values travel sealed (Created.EnvSealed).
const EnvRedacted = "(secret)"

// Env values are secrets (AWS_SECRET_ACCESS_KEY, say), and the log is read
// by anyone who may read the history or the stream. So sandbox.created keeps
// the names with each value EnvRedacted, and the values sealed with
// AES-256-GCM under a key derived from the service's credential secret
// (kept in the service-only KV bucket torpor_config), bound to the sandbox
// id (a sealed blob copied into another sandbox's event does not open).
// Only the service opens them, where a driver is told what to start
// (SpecOf). An event from before carries its env in clear and no seal: it
// is taken as it is.

// envAEAD is the cipher of env values, keyed by HMAC-SHA256(secret,
// "torpor env v1"): a key of its own, never the credential key itself.
func (c *Credentials) envAEAD() (cipher.AEAD, error) {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("torpor env v1"))
	block, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// SealEnv returns env with every value EnvRedacted, and the values sealed
// for sandbox id (empty for no env).
func (c *Credentials) SealEnv(id string, env map[string]string) (map[string]string, string, error) {
	if len(env) == 0 {
		return env, "", nil
	}
	aead, err := c.envAEAD()
	if err != nil {
		return nil, "", fmt.Errorf("seal env: %w", err)
	}
	plain, err := json.Marshal(env)
	if err != nil {
		return nil, "", fmt.Errorf("seal env: %w", err)
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, "", fmt.Errorf("seal env: %w", err)
	}
	sealed := aead.Seal(nonce, nonce, plain, []byte(id))
	redacted := make(map[string]string, len(env))
	for k := range env {
		redacted[k] = EnvRedacted
	}
	return redacted, base64.RawStdEncoding.EncodeToString(sealed), nil
}

// ErrEnvSealed: an env seal that does not open under this service's key
// for this sandbox (another service's, or tampered with).
var ErrEnvSealed = errors.New("env does not open")

// OpenEnv returns the env of sandbox id as created: the sealed values
// opened, or, for an event from before env was sealed, its env as it is.
func (c *Credentials) OpenEnv(id string, created *events.Created) (map[string]string, error) {
	if created.EnvSealed == "" {
		return created.Env, nil
	}
	sealed, err := base64.RawStdEncoding.DecodeString(created.EnvSealed)
	if err != nil {
		return nil, fmt.Errorf("env of %s: %w: %v", id, ErrEnvSealed, err)
	}
	aead, err := c.envAEAD()
	if err != nil {
		return nil, fmt.Errorf("env of %s: %w", id, err)
	}
	if len(sealed) < aead.NonceSize() {
		return nil, fmt.Errorf("env of %s: %w: too short", id, ErrEnvSealed)
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], []byte(id))
	if err != nil {
		return nil, fmt.Errorf("env of %s: %w", id, ErrEnvSealed)
	}
	var env map[string]string
	if err := json.Unmarshal(plain, &env); err != nil {
		return nil, fmt.Errorf("env of %s: %w: %v", id, ErrEnvSealed, err)
	}
	return env, nil
}

// SpecOf is the package's SpecOf with the env opened: what a driver that
// starts the workload is told.
func (c *Credentials) SpecOf(id string, created *events.Created) (Spec, error) {
	s := SpecOf(id, created)
	env, err := c.OpenEnv(id, created)
	if err != nil {
		return s, err
	}
	s.Env = env
	return s, nil
}
