// Package dashboard serves sluice's web dashboard: a single-page app in
// plain JavaScript modules and CSS, embedded in the binary (no build step,
// no CDN, nothing fetched from the network), that reads and acts through
// the same /v1 API as every other client. It holds no data and no
// credentials of its own: with auth on, the browser asks for the admin
// token and sends it as the bearer token of its API calls.
//
// Every page path answers the same HTML shell (the app routes in the
// browser); an unknown path answers the shell with status 404, which the
// app shows as "page not found". Assets are served under /assets/ with a
// strong ETag (a hash of their content); the shell names its entry points
// with that hash (?v=), so those may be cached for good.
package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"regexp"
	"strings"
)

//go:embed assets
var assetFS embed.FS

// ContentSecurityPolicy is sent with every dashboard response: scripts,
// styles, images and API calls from the server itself only, no inline
// script, no framing.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// PagePaths are the ServeMux patterns of the app's pages; each answers the
// shell.
var PagePaths = []string{
	"/",
	"/tasks",
	"/tasks/{id}",
	"/workflows",
	"/workflows/{name}",
	"/runs",
	"/runs/{id}",
	"/workers",
}

// contentTypes maps the extensions of the embedded assets to their media
// types; an asset with another extension is not served.
var contentTypes = map[string]string{
	".js":  "text/javascript; charset=utf-8",
	".css": "text/css; charset=utf-8",
	".svg": "image/svg+xml",
	".png": "image/png",
}

type asset struct {
	body        []byte
	etag        string // quoted, strong
	hash        string // what ?v= carries
	contentType string
}

type handler struct {
	assets   map[string]*asset // by path under assets/ ("app.js")
	shell    []byte
	notFound []byte
	pages    *http.ServeMux
}

var shellTemplate = template.Must(template.New("shell").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>sluice</title>
<link rel="icon" type="image/svg+xml" href="/assets/icon.svg?v={{.Icon}}">
<link rel="stylesheet" href="/assets/app.css?v={{.CSS}}">
<script type="module" src="/assets/app.js?v={{.JS}}"></script>
</head>
<body{{if .NotFound}} data-status="404"{{end}}>
<a class="skip" href="#main">Skip to content</a>
<header class="top">
<a class="brand" href="/" aria-label="sluice overview"><img src="/assets/icon.svg?v={{.Icon}}" alt="" width="24" height="24"> sluice</a>
<nav aria-label="Main">
<ul>
<li><a href="/">Overview</a></li>
<li><a href="/tasks">Tasks</a></li>
<li><a href="/runs">Runs</a></li>
<li><a href="/workflows">Workflows</a></li>
<li><a href="/workers">Workers</a></li>
</ul>
</nav>
<div class="status">
<span id="live" class="live" role="status" aria-live="polite">Connecting…</span>
<button type="button" id="live-toggle" aria-pressed="false">Pause updates</button>
<button type="button" id="forget-token" hidden>Forget token</button>
</div>
</header>
<main id="main" tabindex="-1">
<noscript><p>The sluice dashboard needs JavaScript. The same data is in the HTTP API under <a href="/v1/queues">/v1</a>.</p></noscript>
<p class="loading">Loading…</p>
</main>
</body>
</html>
`))

// New returns the dashboard's handler. It answers GET and HEAD on the
// page paths (PagePaths) and /assets/; a server mounts the API's paths
// (/v1/…, /healthz, /readyz, /metrics) beside it.
func New() http.Handler {
	h := &handler{assets: map[string]*asset{}, pages: http.NewServeMux()}
	err := fs.WalkDir(assetFS, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			return nil
		}
		body, err := assetFS.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		hash := hex.EncodeToString(sum[:8])
		h.assets[strings.TrimPrefix(p, "assets/")] = &asset{body: body, etag: `"` + hash + `"`, hash: hash, contentType: ct}
		return nil
	})
	if err != nil {
		panic("dashboard: reading embedded assets: " + err.Error()) // a build error
	}
	h.shell = h.render(false)
	h.notFound = h.render(true)
	for _, p := range PagePaths {
		pattern := p
		if p == "/" {
			pattern = "/{$}"
		}
		h.pages.HandleFunc(pattern, h.serveShell)
	}
	return h
}

func (h *handler) render(notFound bool) []byte {
	hashOf := func(name string) string {
		if a, ok := h.assets[name]; ok {
			return a.hash
		}
		panic("dashboard: embedded asset missing: " + name)
	}
	var b bytes.Buffer
	err := shellTemplate.Execute(&b, struct {
		JS, CSS, Icon string
		NotFound      bool
	}{hashOf("app.js"), hashOf("app.css"), hashOf("icon.svg"), notFound})
	if err != nil {
		panic("dashboard: rendering the shell: " + err.Error())
	}
	return b.Bytes()
}

// setSecurityHeaders sets the headers every dashboard response carries.
func setSecurityHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", ContentSecurityPolicy)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setSecurityHeaders(w)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if name, ok := strings.CutPrefix(r.URL.Path, "/assets/"); ok {
		h.serveAsset(w, r, name)
		return
	}
	if _, pattern := h.pages.Handler(r); pattern == "" {
		h.writeShell(w, http.StatusNotFound, h.notFound)
		return
	}
	h.pages.ServeHTTP(w, r)
}

// validID is what a page's {id} may be for the page to load; anything
// else still gets the shell, and the app says "not found".
var validID = regexp.MustCompile(`^[0-9]{1,19}$`)

func (h *handler) serveShell(w http.ResponseWriter, r *http.Request) {
	if id := r.PathValue("id"); id != "" && !validID.MatchString(id) {
		h.writeShell(w, http.StatusNotFound, h.notFound)
		return
	}
	h.writeShell(w, http.StatusOK, h.shell)
}

func (h *handler) writeShell(w http.ResponseWriter, code int, body []byte) {
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	// The shell names the assets by hash: it must be fetched again after
	// an upgrade, the assets need not.
	hd.Set("Cache-Control", "no-cache")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

func (h *handler) serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	a, ok := h.assets[name]
	if !ok {
		w.Header().Set("Cache-Control", "no-cache")
		http.Error(w, "no such asset", http.StatusNotFound)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", a.contentType)
	hd.Set("ETag", a.etag)
	if r.URL.Query().Get("v") == a.hash {
		// The URL names this content: it never changes.
		hd.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		// Modules import each other without the hash: revalidate.
		hd.Set("Cache-Control", "no-cache")
	}
	if match := r.Header.Get("If-None-Match"); match != "" && etagMatches(match, a.etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(a.body)
	}
}

// etagMatches reports whether an If-None-Match header names etag.
func etagMatches(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == "*" || t == etag {
			return true
		}
	}
	return false
}
