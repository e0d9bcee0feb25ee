// Package docscheck keeps docs/architecture.md true to the code it names:
// a file renamed, a package moved or a function renamed fails a test here
// instead of leaving the map of the code pointing nowhere.
package docscheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// What counts as a reference in docs/architecture.md, and what it must
// name. A block is a paragraph, a list item, a table row or a fenced
// block (a diagram); a heading is a block of its own.
//
//   - A path: a backticked token of path characters that ends in ".go" or
//     contains "/" (`internal/store/postgres/txn.go`, `flow/lend.go`,
//     `internal/httpapi`), and, outside backticks, any word that ends in
//     ".go" or ".md", and a link's target. It must exist. A path with a
//     "/" is read from the repository root, internal/, internal/store/, a
//     directory the block names, and (a .md, a link) docs/. A bare file
//     name (`claim.go`) is read in the directories the block names (by
//     path, or a package by its name: `protocol`), the root package and
//     the two stores; a store file must be in both stores unless the
//     block or its section names the one that has it ("PostgreSQL",
//     "SQLite").
//   - A Go name: a backticked token that is, without "()" or "(...)", a
//     dotted Go name (`flow.Step`, `claimer.claim`, `Counters.Move`,
//     `server.Open(...).Backend()`), a name of upper- and lower-case
//     letters (`MoveN`, `claimReady`), or a name written with "()"
//     (`fill()`). A lower-case word alone is prose (a state, a column, a
//     setting: `queued`, `lent`), and so are an ALL_CAPS code and a call
//     with arguments (SQL: `count(*)`).
//       - pkg.Name: pkg is the name of a package of the repository
//         (`sluice` is the root's) and Name is declared at its top level
//         or is a method of one of its types; a further .Member is a
//         method or field of Name's type (of any type after a call).
//         Outside backticks, in prose and diagrams, pkg.Name with an
//         upper-case Name is checked the same way.
//       - table.column: a table the migrations create, and a word of the
//         migrations.
//       - Type.Member: a type of that name has a method or field Member.
//       - Name alone: declared (top level, method, field) in a file or
//         package the block names, in every file of the group a bare store
//         file names (both stores); in a block that names none, anywhere.
//   - A flag (`--max-running`, also inside `sluice server --dispatch`): a
//     string of cmd/sluice. A route (`GET /v1/doctor`): its path is a
//     string of internal/httpapi. A metric (`sluice_…`): a string of
//     internal/engine or the root package, with or without its prefix.
//
// Declarations are read with go/parser from every Go file of the
// repository, test files included (a test's name is a reference too);
// strings from the files that are not tests.

// TestArchitectureReferences checks every reference docs/architecture.md
// makes.
func TestArchitectureReferences(t *testing.T) {
	root := repoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := readIndex(root)
	if err != nil {
		t.Fatal(err)
	}
	problems, refs := check(idx, string(doc))
	for _, p := range problems {
		t.Errorf("docs/architecture.md:%s", p)
	}
	t.Logf("%d references checked", refs)
	// A parser that found nothing would pass every document.
	if refs < 100 {
		t.Errorf("only %d references found in docs/architecture.md: the parser no longer reads the document", refs)
	}
}

// fakeRepo is a repository of a few files, for TestArchitectureCheckCatches:
// the check's rules tried against code that does not change.
var fakeRepo = map[string]string{
	"go.mod":                                      "module example.com/fake\n",
	"docs/architecture.md":                        "",
	"worker_producer.go":                          "package fake\n\ntype producer struct{}\n\nfunc (p *producer) freeSlot() {}\n",
	"internal/store/flow/counters.go":             "package flow\n\ntype Counters struct{ dirty bool }\n\nfunc (c *Counters) Move()  {}\nfunc (c *Counters) MoveN() {}\n\ntype Step struct{}\n",
	"internal/store/flow/lend.go":                 "package flow\n\nfunc (c *Counters) Hand() {}\n",
	"internal/store/flow/transitions.go":          "package flow\n",
	"internal/store/flow/transitions_test.go":     "package flow\n\nfunc ExampleRows() {}\n",
	"internal/store/sqlite/claim.go":              "package sqlite\n\ntype Store struct{}\n\nfunc (s *Store) Claim()      {}\nfunc (s *Store) claimReady() {}\n",
	"internal/store/sqlite/flow.go":               "package sqlite\n\nfunc fill()    {}\nfunc promote() {}\n",
	"internal/store/sqlite/migrations/0001.sql":   "CREATE TABLE tasks (id INTEGER, wait_lent INTEGER);\n",
	"internal/store/postgres/claim.go":            "package postgres\n\ntype Store struct{}\n\nfunc (s *Store) Claim() {}\n\ntype claimer struct{}\n\nfunc (w *claimer) claim() {}\n",
	"internal/store/postgres/flow.go":             "package postgres\n\nfunc fill()    {}\nfunc promote() {}\n",
	"internal/store/postgres/notify.go":           "package postgres\n\nfunc notifySoon() {}\n",
	"internal/store/postgres/migrations/0001.sql": "CREATE TABLE tasks (id bigint, wait_lent smallint);\n",
	"server/server.go":                            "package server\n\ntype Server struct{}\n\nfunc Open() *Server { return nil }\n\nfunc (s *Server) Backend() {}\n",
	"cmd/sluice/main.go":                          "package main\n\nvar flags = []string{\"max-running\", \"dispatch\"}\n\nfunc main() {}\n",
	"internal/httpapi/api.go":                     "package httpapi\n\nvar routes = []string{\"POST\", \"/v1/doctor/repair\"}\n",
	"internal/engine/metrics.go":                  "package engine\n\nvar names = []string{\"orphans_released_total\"}\n",
}

// TestArchitectureCheckCatches shows that each kind of reference that
// names nothing fails the check, and that what exists passes.
func TestArchitectureCheckCatches(t *testing.T) {
	root := t.TempDir()
	for name, body := range fakeRepo {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := readIndex(root)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ doc, want string }{
		{"See `internal/store/flow/nosuch.go`.", "internal/store/flow/nosuch.go"},
		{"See `flow/nosuch.go`.", "flow/nosuch.go"},
		{"The store's `nosuch.go`.", "nosuch.go"},
		{"It lives in internal/nosuch/file.go.", "internal/nosuch/file.go"},
		{"The [guide](nosuch.md).", "nosuch.md"},
		{"The core's `flow.NoSuchStep`.", "flow.NoSuchStep"},
		{"The core's `Counters.NoSuchMove`.", "Counters.NoSuchMove"},
		{"The `NoSuchType.Move`.", "NoSuchType.Move"},
		{"The claimer (`nosuchclaimer.claim`).", "nosuchclaimer.claim"},
		{"The column `tasks.no_such_column`.", "tasks.no_such_column"},
		{"Somewhere, `NoSuchFunction`.", "NoSuchFunction"},
		{"The refill, `nosuchfill()`.", "nosuchfill()"},
		// Declared in the repository, not in the file the block names.
		{"`internal/store/flow/lend.go` (`MoveN`)", "MoveN"},
		// Declared in SQLite's claim.go, named for both stores.
		{"Each store's `claim.go` (`Store.Claim`, `claimReady`)", "claimReady"},
		// A file of one store, and the block does not say which.
		{"Each store's `notify.go`.", "notify.go"},
		{"A diagram:\n\n```\n engine ──▶ flow.NoSuchCounter (flow/lend.go)\n```\n", "flow.NoSuchCounter"},
		{"The flag (`sluice server\n--no-such-flag`).", "--no-such-flag"},
		{"Served as `GET /v1/no-such-route`.", "/v1/no-such-route"},
		{"Counted (`sluice_no_such_total`).", "sluice_no_such_total"},
	}
	for _, c := range cases {
		problems, refs := check(idx, c.doc)
		if refs == 0 {
			t.Errorf("%q: no reference found", c.doc)
			continue
		}
		if len(problems) != 1 || !strings.Contains(problems[0], c.want) {
			t.Errorf("%q: want one problem, naming %s; got %q", c.doc, c.want, problems)
		}
	}
	for _, doc := range []string{
		"`internal/store/flow` (`Counters.Move`, `MoveN`; the table in `transitions.go`, `ExampleRows`), `flow/lend.go` (`Hand`), `flow.Step`",
		"`internal/store/postgres/claim.go`, `server.Open(...).Backend()`, `tasks.wait_lent`, [arch](architecture.md), docs/architecture.md",
		"Each store's `flow.go` (`fill()`, `promote()`); `worker_producer.go` (`producer.freeSlot`, `freeSlot`)",
		"SQLite's `sqlite/claim.go` (`claimReady`), PostgreSQL's `claimer.claim` and `notify.go` (`notifySoon`)",
		"`--max-running`, `sluice server --dispatch`, `POST /v1/doctor/repair`, `sluice_orphans_released_total`, `count(*)`, `queued`",
		"A diagram:\n\n```\n engine ──▶ flow.Step (flow/lend.go)\n```\n",
	} {
		problems, refs := check(idx, doc)
		if len(problems) > 0 || refs == 0 {
			t.Errorf("%q: want no problem, got %q (%d references)", doc, problems, refs)
		}
	}
}

// repoRoot is the directory holding go.mod, above the test's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = up
	}
}

const (
	sqliteDir   = "internal/store/sqlite"
	postgresDir = "internal/store/postgres"
)

// index is what the repository declares, by file and by package.
type index struct {
	root    string
	exists  map[string]bool            // every file and directory, slash-separated, relative
	files   map[string]map[string]bool // file → names declared in it
	dirs    map[string]map[string]bool // package directory → names declared in it
	top     map[string]map[string]bool // package directory → its top-level names and methods
	types   map[string]map[string]bool // type name → its methods and fields (every package)
	dirType map[string]map[string]bool // package directory → its type names
	members map[string]map[string]bool // package directory + "." + type → methods and fields
	pkgs    map[string][]string        // package name → directories
	tables  map[string]bool            // tables the migrations create
	sqlText string                     // every migration, for column names
	anyName map[string]bool            // every name declared anywhere
	memberN map[string]bool            // every method and field name
	strs    map[string]map[string]bool // package directory → its string literals (not tests')
}

// readIndex reads what the repository at root declares.
func readIndex(root string) (*index, error) {
	idx := &index{
		root: root, exists: map[string]bool{}, files: map[string]map[string]bool{},
		dirs: map[string]map[string]bool{}, top: map[string]map[string]bool{},
		types: map[string]map[string]bool{}, dirType: map[string]map[string]bool{},
		members: map[string]map[string]bool{}, pkgs: map[string][]string{},
		tables: map[string]bool{}, anyName: map[string]bool{}, memberN: map[string]bool{},
		strs: map[string]map[string]bool{},
	}
	var goFiles, others []string
	var sql strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, root))
		rel = strings.TrimPrefix(rel, "/")
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if rel != "" {
			idx.exists[rel] = true
		}
		switch {
		case d.IsDir():
			// Another module (a peer benchmarked against) is not this
			// repository's code: its files exist, its names do not count.
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil && p != root {
				others = append(others, rel+"/")
			}
		case strings.HasSuffix(rel, ".go") && !slices.Contains(strings.Split(rel, "/"), "testdata") &&
			!slices.ContainsFunc(others, func(o string) bool { return strings.HasPrefix(rel, o) }):
			goFiles = append(goFiles, rel)
		case strings.HasSuffix(rel, ".sql") && strings.Contains(rel, "/migrations/"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sql.Write(b)
			sql.WriteByte('\n')
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	idx.sqlText = sql.String()
	for _, m := range regexp.MustCompile(`(?i)create table (?:if not exists )?(\w+)`).FindAllStringSubmatch(idx.sqlText, -1) {
		idx.tables[strings.ToLower(m[1])] = true
	}

	// Parsing is most of the test's time: spread it over the CPUs.
	parsed := make([]*ast.File, len(goFiles))
	errs := make([]error, len(goFiles))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, rel := range goFiles {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			parsed[i], errs[i] = parser.ParseFile(token.NewFileSet(), filepath.Join(root, rel), nil, parser.SkipObjectResolution)
		}()
	}
	wg.Wait()
	for i, rel := range goFiles {
		if errs[i] != nil {
			return nil, fmt.Errorf("parsing %s: %w", rel, errs[i])
		}
		idx.add(rel, parsed[i])
	}
	return idx, nil
}

func set(m map[string]map[string]bool, k string) map[string]bool {
	s := m[k]
	if s == nil {
		s = map[string]bool{}
		m[k] = s
	}
	return s
}

// stringDirs are the packages whose strings the check reads: the CLI's
// flags, the HTTP API's routes, the engine's and the worker's metrics.
var stringDirs = map[string]bool{"cmd/sluice": true, "internal/httpapi": true, "internal/engine": true, "": true}

// add records the declarations of one file.
func (idx *index) add(rel string, f *ast.File) {
	dir := path.Dir(rel)
	if dir == "." {
		dir = ""
	}
	if name := f.Name.Name; !strings.HasSuffix(name, "_test") {
		if !slices.Contains(idx.pkgs[name], dir) {
			idx.pkgs[name] = append(idx.pkgs[name], dir)
		}
	}
	fileNames, dirNames, top := set(idx.files, rel), set(idx.dirs, dir), set(idx.top, dir)
	if stringDirs[dir] && !strings.HasSuffix(rel, "_test.go") {
		// Flags, routes and metric names are strings of the code.
		strs := set(idx.strs, dir)
		ast.Inspect(f, func(n ast.Node) bool {
			if l, ok := n.(*ast.BasicLit); ok && l.Kind == token.STRING {
				if v, err := strconv.Unquote(l.Value); err == nil {
					strs[v] = true
				}
			}
			return true
		})
	}
	name := func(n string, isTop bool) {
		fileNames[n], dirNames[n], idx.anyName[n] = true, true, true
		if isTop {
			top[n] = true
		}
	}
	member := func(typ, n string) {
		set(idx.types, typ)[n] = true
		set(idx.members, dir+"."+typ)[n] = true
		idx.memberN[n] = true
		name(n, false)
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				name(d.Name.Name, true)
				continue
			}
			// A method is a top-level name of its package for pkg.Name
			// (`store.CreateRun`), and a member of its type.
			name(d.Name.Name, true)
			if typ := recvType(d.Recv.List[0].Type); typ != "" {
				member(typ, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						name(n.Name, true)
					}
				case *ast.TypeSpec:
					typ := s.Name.Name
					name(typ, true)
					set(idx.dirType, dir)[typ] = true
					set(idx.types, typ)
					switch st := s.Type.(type) {
					case *ast.StructType:
						for _, fl := range st.Fields.List {
							for _, n := range fl.Names {
								member(typ, n.Name)
							}
							if len(fl.Names) == 0 {
								if e := recvType(fl.Type); e != "" {
									member(typ, e)
								}
							}
						}
					case *ast.InterfaceType:
						for _, m := range st.Methods.List {
							for _, n := range m.Names {
								member(typ, n.Name)
								top[n.Name] = true
							}
						}
					}
				}
			}
		}
	}
}

// recvType is the type name of a receiver or an embedded field.
func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.SelectorExpr:
			return x.Sel.Name
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// block is a paragraph, list item, table row, heading or fenced block of
// the document, the line it starts on, and the text of its section (from
// its heading to the next).
type block struct {
	line    int
	text    string
	fenced  bool
	section *strings.Builder
}

func blocks(doc string) []block {
	var out []block
	var cur *block
	section := &strings.Builder{}
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	listItem := regexp.MustCompile(`^\s*([-*+]|\d+\.)\s`)
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "#") {
			section = &strings.Builder{}
		}
		section.WriteString(l + "\n")
		switch {
		case strings.HasPrefix(trimmed, "```"):
			flush()
			b := block{line: i + 1, fenced: true, section: section}
			for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
				b.text += lines[i] + "\n"
				section.WriteString(lines[i] + "\n")
			}
			out = append(out, b)
		case trimmed == "":
			flush()
		case strings.HasPrefix(trimmed, "|"), strings.HasPrefix(trimmed, "#"):
			flush()
			out = append(out, block{line: i + 1, text: l, section: section})
		case listItem.MatchString(l):
			flush()
			cur = &block{line: i + 1, text: l, section: section}
		case cur == nil:
			cur = &block{line: i + 1, text: l, section: section}
		default:
			cur.text += "\n" + l
		}
	}
	flush()
	return out
}

var (
	codeSpan  = regexp.MustCompile("`([^`]+)`")
	pathToken = regexp.MustCompile(`^(?:[\w.-]+/)+[\w.-]*/?$|^[\w.-]+\.go$`)
	calls     = regexp.MustCompile(`\((?:\.\.\.)?\)`)
	goName    = regexp.MustCompile(`^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$`)
	proseFile = regexp.MustCompile(`(?:\.\.?/)?(?:[\w-]+/)*[\w-]+\.(?:go|md)\b`)
	proseName = regexp.MustCompile(`\b([a-z]\w*)\.([A-Z]\w*)\b`)
	mdLink    = regexp.MustCompile(`\]\(([^)\s#]+)(?:#[^)]*)?\)`)
	flag      = regexp.MustCompile(`(?:^|\s)--([a-z][a-z0-9-]*)\b`)
	route     = regexp.MustCompile(`^(?:GET|POST|PUT|DELETE) (/v1/\S*)$`)
	metric    = regexp.MustCompile(`^sluice_[a-z0-9_]+$`)
)

// ref is one reference of a block.
type ref struct {
	text   string // as written
	offset int    // in the block's text
}

// check returns a problem per reference that names nothing, "LINE: `ref`:
// why", and how many references it read.
func check(idx *index, doc string) (problems []string, refs int) {
	for _, b := range blocks(doc) {
		bp, n := idx.checkBlock(b)
		problems = append(problems, bp...)
		refs += n
	}
	return problems, refs
}

// scope is a group of files or package directories a block names: a name
// it names is in every member of one of its scopes.
type scope []string

// blank replaces the matches of re in s with spaces, keeping offsets.
func blank(s string, re *regexp.Regexp) string {
	return re.ReplaceAllStringFunc(s, func(m string) string { return strings.Repeat(" ", len(m)) })
}

func (idx *index) checkBlock(b block) (problems []string, refs int) {
	lineOf := func(off int) int { return b.line + strings.Count(b.text[:off], "\n") }
	fail := func(off int, r, why string) {
		problems = append(problems, fmt.Sprintf("%d: `%s`: %s", lineOf(off), r, why))
	}

	// Split the block into code spans and prose; links are checked on
	// their own.
	var spans []ref
	prose := b.text
	if !b.fenced {
		for _, m := range codeSpan.FindAllStringSubmatchIndex(b.text, -1) {
			tok := strings.Join(strings.Fields(b.text[m[2]:m[3]]), " ")
			spans = append(spans, ref{tok, m[2]})
		}
		prose = blank(b.text, codeSpan)
		for _, m := range mdLink.FindAllStringSubmatchIndex(prose, -1) {
			target := prose[m[2]:m[3]]
			if strings.Contains(target, "://") {
				continue
			}
			refs++
			if !idx.exists[path.Clean(path.Join("docs", target))] {
				fail(m[2], target, "link target does not exist (read from docs/)")
			}
		}
		prose = blank(prose, mdLink)
	}

	// The block's paths first: they are the scope of its bare names.
	var scopes []scope
	var paths []ref
	var dirs []string // the directories the block names
	for _, s := range spans {
		if pathToken.MatchString(s.text) {
			paths = append(paths, s)
		} else if ds, ok := idx.pkgs[s.text]; ok {
			// `flow`, `protocol`: a package by its name.
			for _, d := range ds {
				scopes = append(scopes, scope{d})
				dirs = append(dirs, d)
			}
		}
	}
	for _, m := range proseFile.FindAllStringIndex(prose, -1) {
		paths = append(paths, ref{prose[m[0]:m[1]], m[0]})
	}
	// Its relative paths and bare file names are read in the directories
	// it names too.
	for _, p := range paths {
		if r := idx.resolvePath(p.text, nil); strings.Contains(p.text, "/") && r != "" {
			if idx.isDir(r) {
				dirs = append(dirs, r)
			} else {
				dirs = append(dirs, path.Dir(r))
			}
		}
	}
	for _, p := range paths {
		refs++
		if strings.Contains(p.text, "/") {
			r := idx.resolvePath(p.text, dirs)
			switch {
			case r == "":
				fail(p.offset, p.text, "no such file or directory (read from the root, internal/, internal/store/ and the block's directories)")
			case idx.isDir(r) || strings.HasSuffix(r, ".go"):
				scopes = append(scopes, scope{r})
			}
			continue
		}
		sc, why := idx.resolveBare(p.text, dirs, b.text+b.section.String())
		if why != "" {
			fail(p.offset, p.text, why)
			continue
		}
		scopes = append(scopes, sc...)
	}

	// Go names in code spans.
	for _, s := range spans {
		if pathToken.MatchString(s.text) {
			continue
		}
		bare := calls.ReplaceAllString(s.text, "")
		hadCall := bare != s.text
		if !goName.MatchString(bare) {
			continue
		}
		parts := strings.Split(bare, ".")
		if len(parts) == 1 {
			n := parts[0]
			if !hadCall && (strings.ToLower(n) == n || strings.ToUpper(n) == n) {
				continue // prose: a state, a column, a code
			}
			refs++
			if !idx.declaredIn(n, scopes) {
				if len(scopes) == 0 {
					fail(s.offset, s.text, "declared nowhere in the repository")
				} else {
					fail(s.offset, s.text, "not declared in "+describe(scopes))
				}
			}
			continue
		}
		refs++
		if why := idx.dotted(parts); why != "" {
			fail(s.offset, s.text, why)
		}
	}
	// Flags, routes and metrics in code spans.
	for _, s := range spans {
		for _, m := range flag.FindAllStringSubmatch(s.text, -1) {
			refs++
			if !idx.strs["cmd/sluice"][m[1]] {
				fail(s.offset, "--"+m[1], "no such flag in cmd/sluice")
			}
		}
		if m := route.FindStringSubmatch(s.text); m != nil {
			refs++
			if !idx.strs["internal/httpapi"][m[1]] {
				fail(s.offset, s.text, "no such route in internal/httpapi")
			}
		}
		if metric.MatchString(s.text) {
			refs++
			if !idx.anyString(s.text) && !idx.anyString(strings.TrimPrefix(s.text, "sluice_")) {
				fail(s.offset, s.text, "no such metric name in the code")
			}
		}
	}
	// pkg.Name in prose and diagrams.
	for _, m := range proseName.FindAllStringSubmatchIndex(prose, -1) {
		pkg := prose[m[2]:m[3]]
		if _, ok := idx.pkgs[pkg]; !ok {
			continue
		}
		// Not the end of a path or of a longer dotted word.
		if m[0] > 0 && strings.ContainsAny(prose[m[0]-1:m[0]], "/.") {
			continue
		}
		refs++
		if why := idx.dotted([]string{pkg, prose[m[4]:m[5]]}); why != "" {
			fail(m[0], prose[m[0]:m[1]], why)
		}
	}
	return problems, refs
}

// anyString says whether s is a string literal of a package of
// stringDirs.
func (idx *index) anyString(s string) bool {
	for _, strs := range idx.strs {
		if strs[s] {
			return true
		}
	}
	return false
}

// isDir says whether a path the index holds is a directory.
func (idx *index) isDir(p string) bool {
	fi, err := os.Stat(filepath.Join(idx.root, p))
	return err == nil && fi.IsDir()
}

// resolvePath finds a path with a "/" from the root, internal/,
// internal/store/ and dirs (and docs/ for what is written relative to
// it).
func (idx *index) resolvePath(p string, dirs []string) string {
	p = strings.TrimSuffix(p, "/")
	bases := append([]string{"", "internal", "internal/store"}, dirs...)
	if strings.HasSuffix(p, ".md") || strings.HasPrefix(p, "../") {
		bases = append(bases, "docs")
	}
	for _, base := range bases {
		if c := path.Clean(path.Join(base, p)); idx.exists[c] && !strings.HasPrefix(c, "../") {
			return c
		}
	}
	return ""
}

// resolveBare finds a bare file name in the block's directories, the two
// stores, the root package and (for .md) docs/, and returns it as scopes.
// text is what may name the one store that has it.
func (idx *index) resolveBare(name string, dirs []string, text string) ([]scope, string) {
	if strings.HasSuffix(name, ".md") {
		if idx.exists["docs/"+name] || idx.exists[name] {
			return nil, ""
		}
		return nil, "no such document in docs/ or the root"
	}
	var out []scope
	for _, d := range dirs {
		if f := path.Join(d, name); idx.exists[f] {
			out = append(out, scope{f})
		}
	}
	var stores scope
	for _, d := range []string{sqliteDir, postgresDir} {
		if f := path.Join(d, name); idx.exists[f] {
			stores = append(stores, f)
		}
	}
	if len(stores) > 0 {
		out = append(out, stores)
	}
	if idx.exists[name] {
		out = append(out, scope{name})
	}
	if len(out) == 0 {
		return nil, "no such file in the block's directories, the root package or the stores"
	}
	if len(out) == 1 && len(stores) == 1 {
		// One store has it: the block or its section must say which.
		which := map[string]string{sqliteDir: "SQLite", postgresDir: "PostgreSQL"}[path.Dir(stores[0])]
		if !strings.Contains(text, which) {
			return nil, "only " + which + " has it, and neither the block nor its section says so"
		}
	}
	return out, ""
}

// declaredIn says whether n is declared in every member of one of the
// scopes (anywhere when there are none).
func (idx *index) declaredIn(n string, scopes []scope) bool {
	if len(scopes) == 0 {
		return idx.anyName[n]
	}
	for _, sc := range scopes {
		all := true
		for _, m := range sc {
			names := idx.files[m]
			if names == nil {
				names = idx.dirs[m]
			}
			if !names[n] {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

func describe(scopes []scope) string {
	var s []string
	for _, sc := range scopes {
		if d := strings.Join(sc, " and "); !slices.Contains(s, d) {
			s = append(s, d)
		}
	}
	return strings.Join(s, ", or ")
}

// dotted checks pkg.Name[.Member…], Type.Member or table.column.
func (idx *index) dotted(parts []string) string {
	first, second := parts[0], parts[1]
	if dirs, ok := idx.pkgs[first]; ok {
		for _, d := range dirs {
			if !idx.top[d][second] {
				continue
			}
			if len(parts) == 2 {
				return ""
			}
			// A type's member, or (after a call) any method or field.
			mem := idx.members[d+"."+second]
			if !idx.dirType[d][second] {
				mem = idx.memberN
			}
			if mem[parts[2]] && idx.restAreMembers(parts[3:]) {
				return ""
			}
		}
		if _, isType := idx.types[first]; !isType {
			return fmt.Sprintf("package %s declares no %s", first, strings.Join(parts[1:], "."))
		}
	}
	if len(parts) == 2 && idx.tables[first] && regexp.MustCompile(`\b`+regexp.QuoteMeta(second)+`\b`).MatchString(idx.sqlText) {
		return ""
	}
	if mem, ok := idx.types[first]; ok {
		if mem[second] && idx.restAreMembers(parts[2:]) {
			return ""
		}
		return fmt.Sprintf("no type %s has %s", first, strings.Join(parts[1:], "."))
	}
	return "neither a package, a type, nor a table and column of the migrations"
}

func (idx *index) restAreMembers(parts []string) bool {
	for _, p := range parts {
		if !idx.memberN[p] {
			return false
		}
	}
	return true
}
