package dashboard_test

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/internal/dashboard"
)

func get(t *testing.T, h http.Handler, method, target string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func requireSecurityHeaders(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	require.Equal(t, dashboard.ContentSecurityPolicy, w.Header().Get("Content-Security-Policy"))
	require.Contains(t, w.Header().Get("Content-Security-Policy"), "default-src 'self'")
	require.Equal(t, "nosniff", w.Header().Get("X-Content-Type-Options"))
	require.Equal(t, "DENY", w.Header().Get("X-Frame-Options"))
	require.Equal(t, "no-referrer", w.Header().Get("Referrer-Policy"))
}

// Every page path answers the shell, with strict headers; so does a page
// of an id the API may not know (the app asks the API and says "not
// found").
func TestPages(t *testing.T) {
	t.Parallel()
	h := dashboard.New()
	for _, p := range []string{"/", "/tasks", "/tasks/1", "/tasks/9223372036854775807", "/workflows", "/workflows/ingest",
		"/workflows/no-such-workflow", "/runs", "/runs/42", "/workers", "/tasks?state=queued&queue=email", "/runs?workflow=x"} {
		w := get(t, h, "GET", p)
		require.Equal(t, http.StatusOK, w.Code, p)
		require.Equal(t, "text/html; charset=utf-8", w.Header().Get("Content-Type"), p)
		require.Equal(t, "no-cache", w.Header().Get("Cache-Control"), p)
		requireSecurityHeaders(t, w)
		body := w.Body.String()
		require.Contains(t, body, `<script type="module" src="/assets/app.js?v=`, p)
		require.Contains(t, body, `<main id="main"`, p)
		require.NotContains(t, body, "data-status", p)

		w = get(t, h, "HEAD", p)
		require.Equal(t, http.StatusOK, w.Code, p)
	}
}

// The shell has no inline script or style (the policy would block them)
// and loads nothing from another origin.
func TestShellIsSelfContained(t *testing.T) {
	t.Parallel()
	body := get(t, dashboard.New(), "GET", "/").Body.String()
	require.NotRegexp(t, `<script(?:\s+type="module")?>`, body, "inline script")
	require.NotContains(t, body, "<style")
	require.NotContains(t, body, " style=")
	require.NotContains(t, body, " on")
	require.NotRegexp(t, `(?:src|href)="(?:https?:)?//`, body, "a resource from another origin")
}

// Unknown paths answer the shell with 404 (the app shows "page not
// found"); ids that cannot be ids too; other methods 405.
func TestNotFoundAndMethods(t *testing.T) {
	t.Parallel()
	h := dashboard.New()
	for _, p := range []string{"/nope", "/tasks/", "/tasks/1/2", "/tasks/abc", "/runs/-1", "/runs/1e3", "/index.html", "/favicon.ico", "/workersx"} {
		w := get(t, h, "GET", p)
		require.Equal(t, http.StatusNotFound, w.Code, p)
		require.Contains(t, w.Body.String(), `data-status="404"`, p)
		require.Contains(t, w.Body.String(), "/assets/app.js?v=", p)
		requireSecurityHeaders(t, w)
	}
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		w := get(t, h, m, "/tasks")
		require.Equal(t, http.StatusMethodNotAllowed, w.Code, m)
		require.Equal(t, "GET, HEAD", w.Header().Get("Allow"))
	}
}

// Every embedded asset is served with its content type, a strong ETag
// that a conditional request matches, and long caching when the URL
// names its hash.
func TestAssets(t *testing.T) {
	t.Parallel()
	h := dashboard.New()
	want := map[string]string{
		".js":  "text/javascript; charset=utf-8",
		".css": "text/css; charset=utf-8",
		".svg": "image/svg+xml",
	}
	var n int
	require.NoError(t, fs.WalkDir(os.DirFS("assets"), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		ct, ok := want[path.Ext(p)]
		require.True(t, ok, "asset %s has an extension the handler does not serve", p)
		src, err := os.ReadFile(path.Join("assets", p))
		require.NoError(t, err)

		w := get(t, h, "GET", "/assets/"+p)
		require.Equal(t, http.StatusOK, w.Code, p)
		require.Equal(t, ct, w.Header().Get("Content-Type"), p)
		require.Equal(t, "no-cache", w.Header().Get("Cache-Control"), p)
		requireSecurityHeaders(t, w)
		require.Equal(t, string(src), w.Body.String(), p)
		etag := w.Header().Get("ETag")
		require.Regexp(t, `^"[0-9a-f]{16}"$`, etag, p)

		w = get(t, h, "GET", "/assets/"+p, "If-None-Match", etag)
		require.Equal(t, http.StatusNotModified, w.Code, p)
		require.Empty(t, w.Body.String())
		w = get(t, h, "GET", "/assets/"+p, "If-None-Match", `W/`+etag+`, "other"`)
		require.Equal(t, http.StatusNotModified, w.Code, p)
		w = get(t, h, "GET", "/assets/"+p, "If-None-Match", `"stale"`)
		require.Equal(t, http.StatusOK, w.Code, p)

		hash := strings.Trim(etag, `"`)
		w = get(t, h, "GET", "/assets/"+p+"?v="+hash)
		require.Equal(t, "public, max-age=31536000, immutable", w.Header().Get("Cache-Control"), p)
		w = get(t, h, "GET", "/assets/"+p+"?v=0000")
		require.Equal(t, "no-cache", w.Header().Get("Cache-Control"), "a stale hash must not be cached for good")
		return nil
	}))
	require.Greater(t, n, 10)

	// The shell names each entry point with its current hash.
	body := get(t, h, "GET", "/").Body.String()
	for _, name := range []string{"app.js", "app.css", "icon.svg"} {
		etag := get(t, h, "GET", "/assets/"+name).Header().Get("ETag")
		require.Contains(t, body, "/assets/"+name+"?v="+strings.Trim(etag, `"`))
	}
}

func TestUnknownAsset(t *testing.T) {
	t.Parallel()
	h := dashboard.New()
	for _, p := range []string{"/assets/nope.js", "/assets/", "/assets/pages", "/assets/../dashboard.go", "/assets/pages/../app.js.map"} {
		w := get(t, h, "GET", p)
		require.Equal(t, http.StatusNotFound, w.Code, p)
		require.NotContains(t, w.Body.String(), "<html", p)
		requireSecurityHeaders(t, w)
	}
}

// No asset writes data into the page as HTML: every value reaches the
// DOM as text, so nothing the API returns can inject markup.
func TestAssetsWriteNoHTML(t *testing.T) {
	t.Parallel()
	bad := regexp.MustCompile(`innerHTML\s*=|outerHTML\s*=|insertAdjacentHTML|document\.write|eval\(|new Function|setAttribute\(\s*['"]style`)
	require.NoError(t, fs.WalkDir(os.DirFS("assets"), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".js" {
			return err
		}
		src, err := os.ReadFile(path.Join("assets", p))
		require.NoError(t, err)
		require.Empty(t, bad.FindAllString(string(src), -1), "%s writes HTML or evaluates code", p)
		// The SVG namespace (createElementNS) names, it loads nothing.
		rest := strings.ReplaceAll(string(src), "'http://www.w3.org/2000/svg'", "")
		require.NotContains(t, rest, "http://", p)
		require.NotContains(t, rest, "https://", p)
		return nil
	}))
}

// Every page module the app imports exists, and every page path has a
// route in the app.
func TestAppRoutesMatchPagePaths(t *testing.T) {
	t.Parallel()
	app, err := os.ReadFile("assets/app.js")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`from '\./(pages/[a-z]+\.js)'`).FindAllStringSubmatch(string(app), -1) {
		_, err := os.Stat(path.Join("assets", m[1]))
		require.NoError(t, err, "app.js imports %s", m[1])
	}
	for _, p := range dashboard.PagePaths {
		re := "^" + regexp.MustCompile(`\{[a-z]+\}`).ReplaceAllString(strings.ReplaceAll(p, "/", `\/`), "([^/]+)") + "$"
		require.True(t, strings.Contains(string(app), "[/"+re+"/,"), "app.js has no route /%s/ for %s", re, p)
	}
}
