package server

import (
	"net/http"
	"strings"
)

// isAPIPath reports whether path belongs to the HTTP API: everything under
// /v1 (an unknown /v1 path keeps the API's JSON 404), and the health,
// readiness and metrics endpoints.
func isAPIPath(path string) bool {
	switch path {
	case "/v1", "/healthz", "/readyz", "/metrics":
		return true
	}
	return strings.HasPrefix(path, "/v1/")
}

// withDashboard serves the API's paths with api and every other path with
// dash (the dashboard: its pages, its assets, and its 404 page).
func withDashboard(api, dash http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isAPIPath(r.URL.Path) {
			api.ServeHTTP(w, r)
			return
		}
		dash.ServeHTTP(w, r)
	})
}
