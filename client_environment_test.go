package sluice

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClientEnvironment(t *testing.T) {
	t.Parallel()
	s, c := newStub(t, WithToken("adm"))
	s.respond(200, `{"max_running":10,"running":3,"max_active":500,"active":42}`)
	env, err := c.Environment(context.Background())
	require.NoError(t, err)
	require.Equal(t, &Environment{MaxRunning: 10, Running: 3, MaxActive: 500, Active: 42}, env)
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Equal(t, "GET", s.method)
	require.Equal(t, "/v1/environment", s.uri)
	require.Equal(t, "Bearer adm", s.auth)
}
