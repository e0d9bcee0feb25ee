package sluice

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestClientDoctor(t *testing.T) {
	t.Parallel()
	s, c := newStub(t, WithToken("adm"))
	s.respond(200, `{"findings":[{"check":"sub-queue running","subject":"email/","have":3,"want":2,"repairable":true,
		"message":"counter 3, its rows give 2","fix":"repair"}],"repairs":[],"checks":26,"took":"4ms"}`)
	r, err := c.Doctor(context.Background())
	require.NoError(t, err)
	require.Equal(t, &DoctorReport{
		Findings: []DoctorFinding{{Check: "sub-queue running", Subject: "email/", Have: 3, Want: 2, Repairable: true,
			Message: "counter 3, its rows give 2", Fix: "repair"}},
		Repairs: []CounterRepair{}, Checks: 26, Took: Duration(4 * time.Millisecond),
	}, r)
	s.mu.Lock()
	require.Equal(t, "GET", s.method)
	require.Equal(t, "/v1/doctor", s.uri)
	require.Equal(t, "Bearer adm", s.auth)
	s.mu.Unlock()

	s.respond(200, `{"findings":[],"repairs":[{"check":"sub-queue running","subject":"email/","from":3,"to":2}],"checks":26,"took":"6ms"}`)
	r, err = c.RepairCounters(context.Background())
	require.NoError(t, err)
	require.Equal(t, []CounterRepair{{Check: "sub-queue running", Subject: "email/", From: 3, To: 2}}, r.Repairs)
	require.Empty(t, r.Findings)
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Equal(t, "POST", s.method)
	require.Equal(t, "/v1/doctor/repair", s.uri)
}
