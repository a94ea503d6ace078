//! No import cycles between keyward's modules, and no import that crosses its layers the wrong way
//! (`FORBIDDEN`, the table `docs/architecture.md` states), directly or through other modules.
//!
//! Reads the sources as text (no build of its own): starting from each crate root (`src/lib.rs`,
//! `src/main.rs`, `src/bin/*/main.rs`) it follows `mod NAME;` to every file, collects the paths each file
//! names (`use` trees and `crate::`/`super::`/`self::` paths in code, comments and strings left out),
//! resolves each to the file that holds it, and looks for strongly connected components in that graph,
//! and in the same graph between top-level modules (a folder such as `raft/` counting as one).
//! A `mod NAME;` declaration is not an import: a parent may declare a child the child imports from.
//! An import of the file's own inline module (`mod tests { use super::*; }`) is no edge either.
//!
//! Run it alone: `cargo test --test it module_cycles::`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module held by one file, as a path from the crate root (`["auth", "store"]`; the root is `[]`).
type ModPath = Vec<String>;

/// One crate: every file module, its source, and the child modules it declares.
struct Crate {
    name: String,
    files: BTreeMap<ModPath, (PathBuf, String)>,
}

/// Where an import was seen, to make a reported cycle easy to find.
#[derive(Clone, Debug)]
struct Witness {
    line: usize,
    path: String,
}

#[test]
fn no_import_cycles_between_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots =
        vec![("keyward (lib)".to_string(), root.join("src/lib.rs")), ("keyward".into(), root.join("src/main.rs"))];
    let mut bins: Vec<PathBuf> = std::fs::read_dir(root.join("src/bin"))
        .map(|dir| dir.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    bins.sort();
    for bin in bins {
        let main = if bin.is_dir() { bin.join("main.rs") } else { bin.clone() };
        let name = bin.file_stem().unwrap().to_string_lossy().into_owned();
        roots.push((name, main));
    }
    let mut report = String::new();
    let mut modules = 0;
    for (name, main) in roots {
        let krate = load_crate(&name, &main);
        modules += krate.files.len();
        let graph = import_graph(&krate);
        for component in cycles(&graph) {
            report.push_str(&describe_cycle(&krate, &graph, &component));
        }
        // And between the crate's top-level modules (`raft` with all of `raft/` as one).
        let top = top_level(&graph);
        for component in cycles(&top) {
            report.push_str(&format!("(top-level modules) {}", describe_cycle(&krate, &top, &component)));
        }
    }
    assert!(modules > 40, "only {modules} modules found: the crate roots moved?");
    assert!(report.is_empty(), "import cycles between modules:\n{report}");
}

/// The checker finds a cycle through a `super::` import and one through a re-export, and none where a
/// parent only declares the child that imports from it.
#[test]
fn the_checker_sees_cycles() {
    let krate = |files: &[(&str, &str)]| Crate {
        name: "synthetic".into(),
        files: files
            .iter()
            .map(|(path, src)| {
                let module: ModPath =
                    if path.is_empty() { vec![] } else { path.split("::").map(String::from).collect() };
                (module, (PathBuf::from(format!("{path}.rs")), src.to_string()))
            })
            .collect(),
    };
    let cyclic = krate(&[
        ("", "pub mod a; pub mod b; pub mod node;"),
        ("a", "use crate::b::{self, Thing};\nfn f() { let _ = \"crate::node::Node\"; }"),
        ("b", "pub struct Thing; fn g() -> crate::node::Node { todo!() } // crate::a::x"),
        ("node", "use super::a::f;"),
    ]);
    let found = cycles(&import_graph(&cyclic));
    assert_eq!(found, vec![BTreeSet::from([vec!["a".to_string()], vec!["b".into()], vec!["node".into()]])]);

    let nested = krate(&[
        ("", "pub mod m;"),
        ("m", "mod child;\npub use child::Child;\npub struct Parent;"),
        (
            "m::child",
            "pub struct Child;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::Parent;\n}",
        ),
    ]);
    let found = cycles(&import_graph(&nested));
    assert_eq!(found.len(), 1, "child imports its parent, which re-exports the child: {found:?}");

    // Acyclic file by file, but `a` and `b` (each with its folder) import each other.
    let across = krate(&[
        ("", "pub mod a; pub mod b;"),
        ("a", "pub mod types; pub mod run;"),
        ("a::types", "pub struct T;"),
        ("a::run", "use crate::b::step;"),
        ("b", "use crate::a::types::T; pub fn step() {}"),
    ]);
    assert!(cycles(&import_graph(&across)).is_empty());
    assert_eq!(cycles(&top_level(&import_graph(&across))).len(), 1);

    let acyclic = krate(&[
        ("", "pub mod m;"),
        ("m", "mod child;\npub struct Parent;"),
        ("m::child", "use super::Parent;\nmod tests { use super::*; }"),
    ]);
    assert!(cycles(&import_graph(&acyclic)).is_empty());
}

// ---------------------------------------------------------------------------
// Layers: the forbidden edges
// ---------------------------------------------------------------------------

/// The layering rules of `docs/architecture.md`: no module under a `from` folder may reach a module
/// under a `to` folder, directly or through any chain of imports (a rule that held only for direct
/// imports let the proxy's identity code pull in LMDB through `auth`).
const FORBIDDEN: &[Rule] = &[
    Rule {
        from: &["frontend", "identity", "gateway", "proxy"],
        to: &["storage", "raft", "node", "server", "apply", "mvcc", "lease", "space", "cluster"],
        why: "the connection layer, who is calling, the gateway and the proxy run without a store or a member",
    },
    Rule {
        from: &["identity"],
        to: &["auth", "storage"],
        why: "who is calling is plain data: deciding what they may do is auth's",
    },
    Rule {
        from: &["error", "keyrange", "proto", "signals", "metrics"],
        to: &["storage", "raft", "mvcc", "lease", "auth", "space", "node", "server", "apply", "cluster"],
        why: "the shared leaves name no store and no service",
    },
    Rule {
        from: &["storage"],
        to: &[
            "mvcc",
            "lease",
            "auth",
            "space",
            "apply",
            "raft",
            "node",
            "server",
            "cluster",
            "frontend",
            "gateway",
            "proxy",
            "watch_hub",
        ],
        why: "LMDB's wrapper is the bottom layer",
    },
    Rule {
        from: &["mvcc", "lease", "auth", "space", "apply"],
        to: &["raft", "node", "server", "cluster", "frontend", "gateway", "proxy", "watch_hub"],
        why: "the stores and the apply step are deterministic: they know nothing of how requests arrive",
    },
    Rule {
        from: &["raft", "watch_hub"],
        to: &["node", "server", "gateway", "proxy"],
        why: "the log, the state machine and the watch fan-out are below the services",
    },
];

/// One row of the table.
struct Rule {
    from: &'static [&'static str],
    to: &'static [&'static str],
    why: &'static str,
}

#[test]
fn no_forbidden_edges_between_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let krate = load_crate("keyward (lib)", &root.join("src/lib.rs"));
    let graph = import_graph(&krate);
    for rule in FORBIDDEN {
        for folder in rule.from.iter().chain(rule.to) {
            assert!(
                krate.files.contains_key(&vec![folder.to_string()]),
                "the table names `{folder}`, which is no module"
            );
        }
    }
    let report = forbidden_edges(&krate, &graph, FORBIDDEN);
    assert!(report.is_empty(), "forbidden edges between layers:\n{report}");
}

/// The checker finds a forbidden module reached through a chain, and is silent where the chain is
/// only allowed edges.
#[test]
fn the_layer_checker_sees_indirect_edges() {
    let krate = Crate {
        name: "synthetic".into(),
        files: [
            ("", "mod identity; mod auth; mod storage;"),
            ("identity", "use crate::auth::check;"),
            ("auth", "pub mod check;"),
            ("auth::check", "use crate::storage::Db;"),
            ("storage", "pub struct Db;"),
        ]
        .iter()
        .map(|(path, src)| {
            let module: ModPath = if path.is_empty() { vec![] } else { path.split("::").map(String::from).collect() };
            (module, (PathBuf::from(format!("{path}.rs")), src.to_string()))
        })
        .collect(),
    };
    let graph = import_graph(&krate);
    let rule = |from: &'static [&'static str], to: &'static [&'static str]| [Rule { from, to, why: "test" }];
    let report = forbidden_edges(&krate, &graph, &rule(&["identity"], &["storage"]));
    assert!(report.contains("identity -> auth::check -> storage"), "{report}");
    assert!(forbidden_edges(&krate, &graph, &rule(&["storage"], &["identity"])).is_empty());
    assert!(forbidden_edges(&krate, &graph, &rule(&["auth"], &["identity"])).is_empty());
}

/// Every module under a rule's `from` that reaches a module under its `to`, with the shortest chain
/// of imports that does it (one per `from` module and rule).
fn forbidden_edges(krate: &Crate, graph: &Graph, rules: &[Rule]) -> String {
    let under = |m: &ModPath, folders: &[&str]| m.first().is_some_and(|top| folders.contains(&top.as_str()));
    let mut report = String::new();
    for rule in rules {
        for start in graph.keys().filter(|m| under(m, rule.from)) {
            // Breadth first, remembering how each module was reached.
            let mut came_from: BTreeMap<&ModPath, (&ModPath, &Witness)> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut seen = BTreeSet::from([start]);
            while let Some(module) = queue.pop_front() {
                if under(module, rule.to) {
                    let mut chain = vec![module];
                    let mut steps = Vec::new();
                    while let Some((prev, witness)) = came_from.get(chain.last().unwrap()) {
                        steps.push(format!(
                            "    {}:{}: {}",
                            krate.files[*prev].0.display(),
                            witness.line,
                            witness.path
                        ));
                        chain.push(prev);
                    }
                    chain.reverse();
                    steps.reverse();
                    let names: Vec<String> = chain.iter().map(|m| m.join("::")).collect();
                    report.push_str(&format!("  {} ({})\n{}\n", names.join(" -> "), rule.why, steps.join("\n")));
                    break;
                }
                for (next, witness) in &graph[module] {
                    if seen.insert(next) {
                        came_from.insert(next, (module, witness));
                        queue.push_back(next);
                    }
                }
            }
        }
    }
    report
}

// ---------------------------------------------------------------------------
// Loading a crate
// ---------------------------------------------------------------------------

fn load_crate(name: &str, main: &Path) -> Crate {
    let mut files = BTreeMap::new();
    let mut todo = vec![(ModPath::new(), main.to_path_buf())];
    while let Some((module, file)) = todo.pop() {
        let source = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let own_dir = is_dir_owner(&file, module.is_empty());
        let dir = if own_dir {
            file.parent().unwrap().to_path_buf()
        } else {
            file.parent().unwrap().join(file.file_stem().unwrap())
        };
        for child in declared_children(&strip(&source)) {
            let candidates = [dir.join(format!("{child}.rs")), dir.join(&child).join("mod.rs")];
            let Some(found) = candidates.iter().find(|c| c.is_file()) else {
                panic!(
                    "{}: `mod {child};` has no file ({} or {})",
                    file.display(),
                    candidates[0].display(),
                    candidates[1].display()
                )
            };
            let mut path = module.clone();
            path.push(child);
            todo.push((path, found.clone()));
        }
        files.insert(module, (file, source));
    }
    Crate { name: name.to_string(), files }
}

/// Whether a file's child modules live beside it (`mod.rs`, a crate root) or in a folder named after it.
fn is_dir_owner(file: &Path, is_root: bool) -> bool {
    is_root || file.file_name().is_some_and(|n| n == "mod.rs")
}

/// `mod NAME;` at any depth of the file (inline modules' own `mod NAME;` would need a folder of their
/// own, which keyward does not use).
fn declared_children(cleaned: &str) -> Vec<String> {
    let tokens = tokenize(cleaned);
    let mut out = Vec::new();
    for w in tokens.windows(3) {
        if w[0].text == "mod" && is_ident(&w[1].text) && w[2].text == ";" {
            out.push(w[1].text.clone());
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The import graph
// ---------------------------------------------------------------------------

type Graph = BTreeMap<ModPath, BTreeMap<ModPath, Witness>>;

fn import_graph(krate: &Crate) -> Graph {
    let mut graph: Graph = krate.files.keys().map(|m| (m.clone(), BTreeMap::new())).collect();
    for (module, (_, source)) in &krate.files {
        let tokens = tokenize(&strip(source));
        let children: BTreeSet<String> = declared_children(&strip(source)).into_iter().collect();
        for (line, scope, path) in referenced_paths(&tokens) {
            // `scope` is the inline module path inside this file where the path was written.
            let mut here = module.clone();
            here.extend(scope.iter().cloned());
            let Some(absolute) = resolve(&path, &here, module, &children) else { continue };
            let Some(target) = longest_known_prefix(&absolute, krate) else { continue };
            if &target != module {
                graph.get_mut(module).unwrap().entry(target).or_insert(Witness { line, path: path.join("::") });
            }
        }
    }
    graph
}

/// A path written in module `here` (file module `file`, with `children` declared by `mod NAME;` in that
/// file) as an absolute module path, or `None` for paths into other crates and the prelude.
fn resolve(path: &[String], here: &ModPath, file: &ModPath, children: &BTreeSet<String>) -> Option<ModPath> {
    let first = path.first()?;
    let (mut base, rest) = match first.as_str() {
        "crate" => (ModPath::new(), &path[1..]),
        "self" => (here.clone(), &path[1..]),
        "super" => {
            let mut base = here.clone();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            (base, rest)
        }
        // A child module declared in this file, named from the file's own top level.
        name if here == file && children.contains(name) => (file.clone(), path),
        _ => return None,
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

fn longest_known_prefix(path: &ModPath, krate: &Crate) -> Option<ModPath> {
    (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| krate.files.contains_key(p))
}

/// Every path the file names: the leaves of `use` trees, and `a::b::c` paths in code that start at
/// `crate`, `self`, `super` or a plain identifier. Each with its line and the inline-module scope.
fn referenced_paths(tokens: &[Token]) -> Vec<(usize, Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    let mut scope: Vec<(String, usize)> = Vec::new(); // inline module, brace depth inside it
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i].text;
        let names = || scope.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        if t == "mod" && i + 2 < tokens.len() && is_ident(&tokens[i + 1].text) && tokens[i + 2].text == "{" {
            depth += 1;
            scope.push((tokens[i + 1].text.clone(), depth));
            i += 3;
            continue;
        }
        match t.as_str() {
            "{" => depth += 1,
            "}" => {
                if scope.last().is_some_and(|(_, d)| *d == depth) {
                    scope.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "use" => {
                let line = tokens[i].line;
                let (paths, next) = use_tree(tokens, i + 1, Vec::new());
                let here = names();
                out.extend(paths.into_iter().map(|p| (line, here.clone(), p)));
                i = next;
                continue;
            }
            _ if is_ident(t) && (i == 0 || tokens[i - 1].text != "::") => {
                let mut path = vec![t.clone()];
                let mut j = i + 1;
                while j + 1 < tokens.len() && tokens[j].text == "::" && is_ident(&tokens[j + 1].text) {
                    path.push(tokens[j + 1].text.clone());
                    j += 2;
                }
                if path.len() > 1 {
                    out.push((tokens[i].line, names(), path));
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Parses one use tree starting at `i` (after `use`, or inside braces); returns its leaf paths and
/// the index after it (after the `;` at the top level).
fn use_tree(tokens: &[Token], mut i: usize, prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let mut path = prefix;
    let mut out = Vec::new();
    while i < tokens.len() {
        let t = tokens[i].text.as_str();
        match t {
            "::" => i += 1,
            "{" => {
                i += 1;
                loop {
                    if i >= tokens.len() {
                        return (out, i);
                    }
                    if tokens[i].text == "}" {
                        i += 1;
                        break;
                    }
                    if tokens[i].text == "," {
                        i += 1;
                        continue;
                    }
                    let (inner, next) = use_tree(tokens, i, path.clone());
                    out.extend(inner);
                    i = next;
                }
            }
            "*" => {
                out.push(path.clone());
                i += 1;
            }
            "as" => i += 2,
            ";" => {
                if !path.is_empty() && out.is_empty() {
                    out.push(path);
                }
                return (out, i + 1);
            }
            "," | "}" => {
                if !path.is_empty() && out.is_empty() {
                    out.push(path);
                }
                return (out, i);
            }
            _ if is_ident(t) => {
                // `self` inside braces names the prefix itself.
                if t != "self" || path.is_empty() {
                    path.push(t.to_string());
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    (out, i)
}

/// The graph between top-level modules: every module counts as the top-level module it is in.
fn top_level(graph: &Graph) -> Graph {
    let top = |m: &ModPath| m.iter().take(1).cloned().collect::<ModPath>();
    let mut out: Graph = graph.keys().map(|m| (top(m), BTreeMap::new())).collect();
    for (from, edges) in graph {
        for (to, witness) in edges {
            if top(from) != top(to) {
                out.get_mut(&top(from)).unwrap().entry(top(to)).or_insert_with(|| witness.clone());
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Cycles
// ---------------------------------------------------------------------------

/// Strongly connected components of more than one module (Tarjan).
fn cycles(graph: &Graph) -> Vec<BTreeSet<ModPath>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g ModPath, usize>,
        low: BTreeMap<&'g ModPath, usize>,
        stack: Vec<&'g ModPath>,
        on_stack: BTreeSet<&'g ModPath>,
        out: Vec<BTreeSet<ModPath>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g ModPath) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph[v].keys() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[w].min(self.low[v]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.index[w].min(self.low[v]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.insert(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.out.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

fn describe_cycle(krate: &Crate, graph: &Graph, component: &BTreeSet<ModPath>) -> String {
    let name = |m: &ModPath| if m.is_empty() { "<crate root>".to_string() } else { m.join("::") };
    let mut s = format!("{}: {}\n", krate.name, component.iter().map(name).collect::<Vec<_>>().join(", "));
    for from in component {
        for (to, witness) in &graph[from] {
            if component.contains(to) {
                let file = krate.files[from].0.display();
                s.push_str(&format!(
                    "  {} -> {}   ({file}:{}: {})\n",
                    name(from),
                    name(to),
                    witness.line,
                    witness.path
                ));
            }
        }
    }
    s
}

// ---------------------------------------------------------------------------
// Text
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct Token {
    text: String,
    line: usize,
}

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

fn tokenize(cleaned: &str) -> Vec<Token> {
    let chars: Vec<char> = cleaned.chars().collect();
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(Token { text: chars[start..i].iter().collect(), line });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push(Token { text: "::".into(), line });
            i += 2;
        } else {
            tokens.push(Token { text: c.to_string(), line });
            i += 1;
        }
    }
    tokens
}

/// The source with comments, string and char literals blanked out (newlines kept, so lines still count).
fn strip(source: &str) -> String {
    let c: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (c.get(i + 1) == Some(&'"') || c.get(i + 1) == Some(&'#'))
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &c[i..j.min(c.len())] {
                blank(&mut out, ch);
            }
            i = j;
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only the former is blanked.
            if c.get(i + 1) == Some(&'\\') {
                let mut j = i + 2;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                (i..=j.min(c.len() - 1)).for_each(|_| out.push(' '));
                i = j + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                out.push_str("   ");
                i += 3;
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}
