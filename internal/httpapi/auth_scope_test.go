package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

// workerProtocol is every route of the worker protocol: the routes the
// worker token reaches.
var workerProtocol = []string{
	"POST /v1/workers",
	"DELETE /v1/workers/{id}",
	"POST /v1/workers/{id}/claim",
	"POST /v1/workers/{id}/complete",
	"POST /v1/workers/{id}/heartbeat",
	"POST /v1/workers/{id}/release",
	"POST /v1/workers/{wid}/tasks/{id}/children",
	"POST /v1/workers/{wid}/tasks/{id}/wait",
}

// TestTokenScopes: the admin token reaches the worker protocol's routes
// too (programs and commands rely on one token; docs/operations.md,
// "Security: tokens"), and the worker token reaches no other route. Both
// are checked over the whole route table, so a route added later is
// covered; and the routes scoped to workers must be exactly the
// protocol's, so no admin route opens to the worker token by a wrong
// scope in the table.
func TestTokenScopes(t *testing.T) {
	t.Parallel()
	var scoped []string
	for _, rt := range httpapi.Routes {
		if rt.Scope == httpapi.ScopeWorker {
			scoped = append(scoped, rt.Method+" "+rt.Path)
		}
	}
	require.ElementsMatch(t, workerProtocol, scoped, "the routes the worker token reaches")

	on := httpapi.Options{AdminToken: adminToken, WorkerToken: workerToken}
	concrete := strings.NewReplacer("{name}", "email", "{id}", "1", "{wid}", "w1")
	for _, rt := range httpapi.Routes {
		if rt.Scope == httpapi.ScopePublic {
			continue
		}
		path := concrete.Replace(rt.Path)
		t.Run(rt.Method+" "+rt.Path, func(t *testing.T) {
			t.Parallel()
			// Past auth, a request without a body may still be refused
			// (400): anything but 401 and 403 got through.
			h, _ := newAPI(t, on)
			w := do(h, rt.Method, path, "", adminToken)
			require.NotEqual(t, http.StatusUnauthorized, w.Code, "admin token: %s", w.Body)
			require.NotEqual(t, http.StatusForbidden, w.Code, "admin token: %s", w.Body)

			h, f := newAPI(t, on)
			w = do(h, rt.Method, path, "", workerToken)
			if rt.Scope == httpapi.ScopeWorker {
				require.NotEqual(t, http.StatusUnauthorized, w.Code, "worker token: %s", w.Body)
				require.NotEqual(t, http.StatusForbidden, w.Code, "worker token: %s", w.Body)
				return
			}
			require.Equal(t, http.StatusForbidden, w.Code, "worker token on an admin route: %s", w.Body)
			require.Equal(t, sluice.CodeForbidden, errorOf(t, w).Code)
			require.Empty(t, f.Calls(), "refused before the backend")
		})
	}
}
