//! The segment tries a host bucket indexes its prefix and template routes in.
//!
//! The prefix trie is stored flat, one hash map from a node's path (`/svc/api`: the request
//! path up to a `/` or its end) to the node's routes, rather than as nodes owning maps of
//! children: a one-child node would cost a whole hash table, and most nodes have one child.
//! A lookup walks the request path's cuts down the map, stopping at the first cut no route
//! continues with: O(path segments) hash lookups however many routes there are.
//!
//! The template trie has real nodes: a node's literal children by segment, one child for a
//! `{name}` segment, and the routes ending there or taking the rest of the path there
//! (`{name...}`). A lookup visits each node at most once (a node is reached by one sequence of
//! choices), so its cost is bounded by the templates' own shape, not by their number alone.

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::config::route_match::TemplateSeg;

/// The tries' hasher: seeded per map (a client chooses the paths looked up), and a few times
/// cheaper than SipHash on short strings.
pub(super) type Seeded = foldhash::fast::RandomState;

/// Indices into the table's routes of the routes at a node, in table order (the index is the
/// route's rank). Usually one.
pub(super) type Routes = SmallVec<[usize; 1]>;

/// The routes of one bucket by `path_prefix` (see the module comment).
#[derive(Debug, Default)]
pub(super) struct PrefixTrie {
    /// The routes of `/`, which matches every path.
    pub(super) root: Routes,
    /// Every other node by its path, the inner nodes on the way to a prefix included (with no
    /// routes) so that a walk stops at the first segment no route continues with.
    pub(super) nodes: HashMap<Box<str>, Routes, Seeded>,
    /// The nodes of routes with `case_sensitive = false`, by their lower-case path; walked with
    /// the request path in lower case, and only when there are any.
    pub(super) folded: HashMap<Box<str>, Routes, Seeded>,
}

/// Where `path` may be cut into a node's path: before each `/` and at its end. Cutting the
/// whole string keeps the rule exact for any prefix `p` but `/`: `p` matches `path` when
/// `path` is `p` or starts with `p` followed by `/`, that is when `p` is one of these cuts.
pub(super) fn cuts(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(|(i, _)| i)
        .chain(std::iter::once(path.len()))
        .filter_map(|end| path.get(..end))
}

impl PrefixTrie {
    pub(super) fn insert(&mut self, prefix: &str, case_sensitive: bool, route: usize) {
        if prefix == "/" {
            self.root.push(route);
            return;
        }
        let nodes = if case_sensitive {
            &mut self.nodes
        } else {
            &mut self.folded
        };
        for node in cuts(prefix) {
            if !nodes.contains_key(node) {
                nodes.insert(Box::from(node), Routes::new());
            }
        }
        if let Some(routes) = nodes.get_mut(prefix) {
            routes.push(route);
        }
    }

    /// Calls `visit` with the routes of every node `path` passes through (`/` first, then
    /// deeper): the candidates whose prefix matches. `lower` is the path in lower case, for
    /// the folded nodes.
    pub(super) fn visit(&self, path: &str, lower: &str, visit: &mut impl FnMut(&Routes)) {
        if !self.root.is_empty() {
            visit(&self.root);
        }
        for (nodes, path) in [(&self.nodes, path), (&self.folded, lower)] {
            if nodes.is_empty() {
                continue;
            }
            for node in cuts(path) {
                let Some(routes) = nodes.get(node) else {
                    break;
                };
                if !routes.is_empty() {
                    visit(routes);
                }
            }
        }
    }
}

/// One node of a [`TemplateTrie`].
#[derive(Debug, Default)]
struct Node {
    /// Children by literal segment.
    lits: HashMap<Box<str>, u32, Seeded>,
    /// The child of a `{name}` segment.
    param: Option<u32>,
    /// Routes whose template ends here.
    end: Routes,
    /// Routes whose template takes the rest of the path here (`{name...}`).
    rest: Routes,
}

/// The template routes of one bucket (case-sensitive ones, or folded ones with their literals in
/// lower case, walked with the path in lower case).
#[derive(Debug, Default)]
pub(super) struct TemplateTrie {
    nodes: Vec<Node>,
}

/// The most segments of a request path a template lookup walks: deeper paths match templates
/// of this depth through `{name...}` only.
const MAX_WALK: usize = 64;

impl TemplateTrie {
    pub(super) fn insert(&mut self, segs: &[TemplateSeg], route: usize) {
        if self.nodes.is_empty() {
            self.nodes.push(Node::default());
        }
        let mut at = 0usize;
        for seg in segs {
            let next = match seg {
                TemplateSeg::Rest(_) => {
                    if let Some(n) = self.nodes.get_mut(at) {
                        n.rest.push(route);
                    }
                    return;
                }
                TemplateSeg::Lit(l) => self.nodes.get(at).and_then(|n| n.lits.get(l).copied()),
                TemplateSeg::Param(_) => self.nodes.get(at).and_then(|n| n.param),
            };
            at = match next {
                Some(n) => n as usize,
                None => {
                    let id = self.nodes.len();
                    let Ok(id32) = u32::try_from(id) else {
                        return;
                    };
                    self.nodes.push(Node::default());
                    if let Some(n) = self.nodes.get_mut(at) {
                        match seg {
                            TemplateSeg::Lit(l) => {
                                n.lits.insert(l.clone(), id32);
                            }
                            _ => n.param = Some(id32),
                        }
                    }
                    id
                }
            };
        }
        if let Some(n) = self.nodes.get_mut(at) {
            n.end.push(route);
        }
    }

    /// Calls `visit` with the routes of every template matching `path`.
    pub(super) fn visit(&self, path: &str, visit: &mut impl FnMut(&Routes)) {
        if self.nodes.is_empty() {
            return;
        }
        let body = path.strip_prefix('/').unwrap_or(path);
        let segs: SmallVec<[&str; 16]> = if body.is_empty() {
            SmallVec::new()
        } else {
            body.split('/').take(MAX_WALK + 1).collect()
        };
        let n = segs.len();
        let mut stack: SmallVec<[(usize, usize); 16]> = SmallVec::new();
        stack.push((0, 0));
        while let Some((at, k)) = stack.pop() {
            let Some(node) = self.nodes.get(at) else {
                continue;
            };
            if !node.rest.is_empty() {
                visit(&node.rest);
            }
            if k == n {
                if !node.end.is_empty() {
                    visit(&node.end);
                }
                continue;
            }
            if k >= MAX_WALK {
                continue;
            }
            let Some(seg) = segs.get(k) else {
                continue;
            };
            if let Some(&c) = node.lits.get(*seg) {
                stack.push((c as usize, k + 1));
            }
            if let Some(c) = node.param.filter(|_| !seg.is_empty()) {
                stack.push((c as usize, k + 1));
            }
        }
    }
}
