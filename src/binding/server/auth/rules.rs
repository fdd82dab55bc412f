//! `auth.rules`: which tools, prompts and resources a caller sees and may use.
//!
//! The first rule that covers an item decides; an item no rule covers is hidden; no rules
//! at all show everything. Whether the caller meets each rule's conditions is worked out
//! once per verified token ([`admitted`], one bit per rule), so deciding an item costs one
//! pass of glob matches over the rules and no allocation ([`allows`]).
//!
//! Lists are filtered as they are served to a session ([`ListFilter`]): the items of the
//! exit's result go through the same streaming rewriter the proxy merges lists with, each
//! item whole, so a list of any length is filtered holding at most one item.

use crate::binding::protocol::unknown_item;
use crate::config::{AUTH_RULES_MAX, Rule};
use crate::jsonrpc::{ItemError, ItemMode, ItemRewriter, ItemRules, ItemSink};
use crate::limits::LIST_KEY_BYTES_MAX;
use crate::stream::{Kind, TargetAt};
use bytes::{Bytes, BytesMut};

/// What kind of item a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Tools,
    Prompts,
    Resources,
}

/// Bit `i` set when the caller meets rule `i`'s conditions: every scope, one of the groups
/// (when it has any), one of the subjects (when it has any).
pub fn admitted(rules: &[Rule], subject: &str, scopes: &[String], groups: &[String]) -> u64 {
    assert!(rules.len() <= AUTH_RULES_MAX);
    let mut bits = 0u64;
    for (i, rule) in rules.iter().enumerate() {
        let scoped = rule.scopes.iter().all(|s| scopes.contains(s));
        let grouped = rule.groups.is_empty() || rule.groups.iter().any(|g| groups.contains(g));
        let named = rule.subjects.is_empty() || rule.subjects.iter().any(|s| s == subject);
        if scoped && grouped && named {
            bits |= 1 << i;
        }
    }
    bits
}

/// Whether a caller with rule bits `admits` may see and use the item `name` (as agents see
/// it: toolkit prefix included).
pub fn allows(rules: &[Rule], admits: u64, family: Family, name: &str) -> bool {
    if rules.is_empty() {
        return true;
    }
    // No list item can be longer (the lists drop longer keys), so no rule needs to look
    // at a longer name: it bounds the glob work a hostile name costs.
    if name.len() > LIST_KEY_BYTES_MAX {
        return false;
    }
    // A URI written another way than its normal form could pass a rule written for the
    // form an upstream resolves it to (see `config::resource_uri_is_normal`).
    if family == Family::Resources && !crate::config::resource_uri_is_normal(name) {
        return false;
    }
    rules
        .iter()
        .position(|rule| covers(rule, family, name))
        .is_some_and(|i| admits & (1 << i) != 0)
}

/// Whether `rule` speaks for the item.
fn covers(rule: &Rule, family: Family, name: &str) -> bool {
    let rest = match rule.toolkit.as_deref() {
        None => name,
        Some(toolkit) => {
            let separator = if family == Family::Resources {
                "+"
            } else {
                "__"
            };
            match name
                .strip_prefix(toolkit)
                .and_then(|r| r.strip_prefix(separator))
            {
                Some(rest) => rest,
                None => return false,
            }
        }
    };
    if rule.tools.is_none() && rule.prompts.is_none() && rule.resources.is_none() {
        return true;
    }
    let globs = match family {
        Family::Tools => &rule.tools,
        Family::Prompts => &rule.prompts,
        Family::Resources => &rule.resources,
    };
    globs.as_ref().is_some_and(|g| g.admits(rest))
}

/// The family of the item a request of `kind` names (`uri`: the target is a URI).
pub fn family_of_target(kind: Kind, uri: bool) -> Option<Family> {
    match kind {
        Kind::ToolsCall => Some(Family::Tools),
        Kind::PromptsGet => Some(Family::Prompts),
        Kind::ResourcesRead | Kind::ResourcesSubscribe | Kind::ResourcesUnsubscribe => {
            Some(Family::Resources)
        }
        Kind::CompletionComplete if uri => Some(Family::Resources),
        Kind::CompletionComplete => Some(Family::Prompts),
        _ => None,
    }
}

/// Why a request may not go on under `rules` (the JSON-RPC error to answer), or `None`:
/// - an item the caller may not use is answered as an unknown one;
/// - a method the gateway does not know (forwarded as is) names nothing the rules can
///   judge, so it is not forwarded;
/// - a completion without a reference names nothing either.
pub fn refusal(
    rules: &[Rule],
    admits: u64,
    kind: Kind,
    target: &Option<(std::rc::Rc<str>, TargetAt)>,
) -> Option<(i32, String)> {
    if rules.is_empty() {
        return None;
    }
    match (kind, target) {
        (Kind::Other, _) => Some((
            crate::jsonrpc::METHOD_NOT_FOUND,
            "Method not found".to_owned(),
        )),
        (Kind::CompletionComplete, None) => Some((
            crate::jsonrpc::INVALID_PARAMS,
            "Invalid params: no item named".to_owned(),
        )),
        (_, Some((name, at))) => {
            let family = family_of_target(kind, at.uri)?;
            (!allows(rules, admits, family, name)).then(|| unknown_item(kind, name))
        }
        _ => None,
    }
}

/// A list kind's family and rewriter rules (the array and the item's name member).
fn list_of(kind: Kind) -> Option<(Family, ItemRules)> {
    let none = Bytes::new();
    Some(match kind {
        Kind::ToolsList => (Family::Tools, ItemRules::tools(none)),
        Kind::PromptsList => (Family::Prompts, ItemRules::prompts(none)),
        Kind::ResourcesList => (Family::Resources, ItemRules::resources(none)),
        Kind::ResourcesTemplatesList => (Family::Resources, ItemRules::resource_templates(none)),
        _ => return None,
    })
}

/// A list result on its way to an agent, without the items it may not see. What comes out
/// is `{"<array>":[` + the admitted items + `]`, the `nextCursor` and `}`; other members of
/// the exit's result are left out.
pub struct ListFilter<'a> {
    rules: &'a [Rule],
    admits: u64,
    family: Family,
    array: &'static [u8],
    rewriter: ItemRewriter,
    sink: ItemSink,
    opened: bool,
}

impl<'a> ListFilter<'a> {
    /// A filter for a list request of `kind`; `None` for other kinds or without rules.
    pub fn new(rules: &'a [Rule], admits: u64, kind: Kind) -> Option<ListFilter<'a>> {
        if rules.is_empty() {
            return None;
        }
        let (family, item_rules) = list_of(kind)?;
        let array = item_rules.array;
        Some(ListFilter {
            rules,
            admits,
            family,
            array,
            rewriter: ItemRewriter::new(item_rules, ItemMode::Items),
            sink: ItemSink::new(),
            opened: false,
        })
    }

    /// Filters one piece of the result; gives what can be written now.
    pub fn feed(&mut self, piece: Bytes) -> Result<Bytes, ItemError> {
        let (rules, admits, family) = (self.rules, self.admits, self.family);
        let mut admit = |name: &str| allows(rules, admits, family, name);
        self.rewriter.feed(piece, &mut admit, &mut self.sink)?;
        let mut out = BytesMut::new();
        self.open(&mut out);
        for part in self.sink.parts.drain(..) {
            out.extend_from_slice(&part);
        }
        Ok(out.freeze())
    }

    /// Ends the result: what is left to write, the list's end included.
    pub fn finish(&mut self) -> Result<Bytes, ItemError> {
        let cursor = self.rewriter.finish()?;
        let mut out = BytesMut::new();
        self.open(&mut out);
        for part in self.sink.parts.drain(..) {
            out.extend_from_slice(&part);
        }
        out.extend_from_slice(b"]");
        if let Some(cursor) = cursor {
            out.extend_from_slice(b",\"nextCursor\":");
            out.extend_from_slice(&cursor);
        }
        out.extend_from_slice(b"}");
        Ok(out.freeze())
    }

    fn open(&mut self, out: &mut BytesMut) {
        if !self.opened {
            self.opened = true;
            out.extend_from_slice(b"{\"");
            out.extend_from_slice(self.array);
            out.extend_from_slice(b"\":[");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AllowList, Glob};

    fn rule(
        toolkit: Option<&str>,
        tools: Option<&[&str]>,
        scopes: &[&str],
        groups: &[&str],
    ) -> Rule {
        Rule {
            toolkit: toolkit.map(str::to_owned),
            tools: tools.map(|t| AllowList::new(t.iter().map(|g| Glob::new(*g)).collect())),
            prompts: None,
            resources: None,
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            groups: groups.iter().map(|s| (*s).to_owned()).collect(),
            subjects: Vec::new(),
        }
    }

    fn owned(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_first_covering_rule_decides_and_uncovered_items_are_hidden() {
        let rules = vec![
            rule(Some("b"), None, &[], &["ops"]),
            rule(None, Some(&["a__add"]), &["mcp:write"], &[]),
            rule(Some("a"), None, &[], &[]),
        ];
        let nobody = admitted(&rules, "alice", &[], &[]);
        let writer = admitted(&rules, "alice", &owned(&["mcp:write"]), &owned(&["ops"]));
        assert_eq!(nobody, 0b100);
        assert_eq!(writer, 0b111);
        assert!(allows(&rules, nobody, Family::Tools, "a__echo"));
        assert!(!allows(&rules, nobody, Family::Tools, "a__add"));
        assert!(!allows(&rules, nobody, Family::Tools, "b__echo"));
        assert!(allows(&rules, writer, Family::Tools, "b__echo"));
        assert!(allows(&rules, writer, Family::Tools, "a__add"));
        // No rule covers another toolkit's items, or a name that only starts alike.
        assert!(!allows(&rules, writer, Family::Tools, "c__echo"));
        assert!(!allows(&rules, writer, Family::Tools, "ab__echo"));
        // A toolkit's resources are `<toolkit>+uri`.
        assert!(allows(&rules, nobody, Family::Resources, "a+file:///x"));
        assert!(!allows(&rules, nobody, Family::Resources, "a__file:///x"));
        assert!(allows(&[], 0, Family::Prompts, "anything"));
    }

    #[test]
    fn a_resource_uri_written_another_way_does_not_slip_past_a_rule() {
        // Secrets need `ops`; everything else is anyone's.
        let mut secret = rule(None, None, &[], &["ops"]);
        secret.resources = Some(AllowList::new(vec![Glob::new("file:///srv/secret/*")]));
        let rules = vec![secret, rule(None, None, &[], &[])];
        let anyone = admitted(&rules, "alice", &[], &[]);
        assert!(allows(
            &rules,
            anyone,
            Family::Resources,
            "file:///srv/public/k"
        ));
        assert!(!allows(
            &rules,
            anyone,
            Family::Resources,
            "file:///srv/secret/k"
        ));
        for alias in [
            "file:///srv/public/../secret/k",
            "file:///srv//secret/k",
            "file:///srv/%73ecret/k",
            "FILE:///srv/secret/k",
            "file://localhost/srv/secret/k",
            "file:///srv/public/%2e%2e/secret/k",
        ] {
            assert!(!allows(&rules, anyone, Family::Resources, alias), "{alias}");
        }
    }

    #[test]
    fn under_rules_unknown_methods_and_unnamed_completions_go_nowhere() {
        let rules = vec![rule(None, Some(&["echo"]), &[], &[])];
        let at = TargetAt {
            start: 0,
            end: 6,
            uri: false,
        };
        let named = |name: &str| Some((std::rc::Rc::from(name), at));
        let code = |r: Option<(i32, String)>| r.map(|(code, _)| code);
        assert_eq!(
            code(refusal(&rules, 1, Kind::Other, &None)),
            Some(crate::jsonrpc::METHOD_NOT_FOUND)
        );
        assert_eq!(
            code(refusal(&rules, 1, Kind::CompletionComplete, &None)),
            Some(crate::jsonrpc::INVALID_PARAMS)
        );
        assert_eq!(refusal(&rules, 1, Kind::ToolsCall, &named("echo")), None);
        assert_eq!(
            refusal(&rules, 0, Kind::ToolsCall, &named("echo")),
            Some((
                crate::jsonrpc::INVALID_PARAMS,
                "Unknown tool: echo".to_owned()
            ))
        );
        // A name longer than any list item is never covered, even by `*`.
        let everything = vec![rule(None, Some(&["*"]), &[], &[])];
        let longest = "e".repeat(crate::limits::LIST_KEY_BYTES_MAX);
        assert_eq!(
            refusal(&everything, 1, Kind::ToolsCall, &named(&longest)),
            None
        );
        let long = "e".repeat(crate::limits::LIST_KEY_BYTES_MAX + 1);
        assert!(refusal(&everything, 1, Kind::ToolsCall, &named(&long)).is_some());
        // Without rules nothing is refused here.
        assert_eq!(refusal(&[], 0, Kind::Other, &None), None);
    }

    #[test]
    fn a_list_is_filtered_whatever_its_pieces_and_keeps_its_cursor() {
        let rules = vec![rule(None, Some(&["ok*"]), &[], &[])];
        let result = br#"{"tools":[{"name":"ok1","d":"x"},{"name":"no"},{"name":"ok2"}],"nextCursor":"c2","_meta":{}}"#;
        for step in [1, 3, 7, result.len()] {
            let mut filter = ListFilter::new(&rules, 1, Kind::ToolsList).unwrap();
            let mut out = Vec::new();
            for piece in result.chunks(step) {
                out.extend_from_slice(&filter.feed(Bytes::copy_from_slice(piece)).unwrap());
            }
            out.extend_from_slice(&filter.finish().unwrap());
            assert_eq!(
                std::str::from_utf8(&out).unwrap(),
                r#"{"tools":[{"name":"ok1","d":"x"},{"name":"ok2"}],"nextCursor":"c2"}"#,
                "pieces of {step}"
            );
        }
        let mut none = ListFilter::new(&rules, 0, Kind::ToolsList).unwrap();
        let mut out = none.feed(Bytes::from_static(result)).unwrap().to_vec();
        out.extend_from_slice(&none.finish().unwrap());
        assert_eq!(&out[..], br#"{"tools":[],"nextCursor":"c2"}"#);
        let mut broken = ListFilter::new(&rules, 1, Kind::ToolsList).unwrap();
        assert!(
            broken
                .feed(Bytes::from_static(b"{\"tools\":[{\"name\""))
                .is_ok()
        );
        assert!(broken.finish().is_err());
        assert!(ListFilter::new(&rules, 1, Kind::ToolsCall).is_none());
        assert!(ListFilter::new(&[], 1, Kind::ToolsList).is_none());
    }
}
