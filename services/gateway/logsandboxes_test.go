package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/rs/zerolog"

	"github.com/torpor/torpor/events"
)

// TestLogSandboxes: GET /v1/log/sandboxes answers the ids the log lists,
// and the log's error as a contract error.
func TestLogSandboxes(t *testing.T) {
	cases := []struct {
		name   string
		ids    []string
		err    error
		status int
		body   string
	}{
		{"two", []string{"a", "b"}, nil, http.StatusOK, `{"items":["a","b"]}`},
		{"none", nil, nil, http.StatusOK, `{"items":[]}`},
		{"the log down", nil, fmt.Errorf("list: %w", events.ErrUnavailable), http.StatusServiceUnavailable, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := NewHTTP(nil, nil, nil, zerolog.Nop()).WithLogSandboxes(func(context.Context) ([]string, error) { return c.ids, c.err })
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/v1/log/sandboxes", nil))
			if w.Code != c.status {
				t.Fatalf("status %d, want %d: %s", w.Code, c.status, w.Body)
			}
			if c.body == "" {
				return
			}
			var got, want LogSandboxes
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || json.Unmarshal([]byte(c.body), &want) != nil || !slices.Equal(got.Items, want.Items) || got.Items == nil {
				t.Fatalf("body %s, want %s", w.Body, c.body)
			}
		})
	}
}
