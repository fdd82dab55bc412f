//! Allow-lists of `*` globs: which tools, prompts and resources a proxy route admits.
//!
//! A proxy route may restrict what its upstream exposes (`tools: ["search_*"]`). The
//! lists are read and checked once by the config loader (`raw.rs`), and the proxy binding
//! asks [`AllowList::admits`] for every name it lists or routes, so matching must be cheap
//! and must never blow up on a hostile name: it runs in linear passes, without
//! backtracking and without allocating.
//!
//! A glob is whole-string: `*` matches any run of characters, including none, and every
//! other character stands for itself. There is no escape and no other wildcard.

/// Most globs in one allow-list; a route lists a few, so a longer list is a mistake.
pub const ALLOW_LIST_GLOBS_MAX: usize = 256;

/// Longest glob, in bytes: room for a long resource URI pattern, and a bound on the work
/// of one match.
pub const GLOB_BYTES_MAX: usize = 1024;

/// One `*` glob, such as `search_*` or `file:///docs/*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    /// The glob as written in the file.
    text: String,
}

impl Glob {
    /// Wraps glob text; any string is a glob (`*` is the wildcard, the rest literal).
    /// The config loader bounds the length and refuses characters that may not appear.
    pub fn new(text: impl Into<String>) -> Self {
        Glob { text: text.into() }
    }

    /// The glob as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `name` matches the whole glob.
    ///
    /// The glob is split on `*` into literal segments: the first must be a prefix of
    /// `name`, the last a suffix that does not overlap it, and the middle ones must occur in
    /// order in what lies between, each taken at its leftmost occurrence. Taking the
    /// leftmost occurrence is never wrong when `*` is the only wildcard: if the segments fit
    /// at some positions, moving one to an earlier occurrence only lengthens the gap after
    /// it, and that gap is a `*`, which matches any run; so if the leftmost choice fails,
    /// every choice fails, and no backtracking is needed. Each step is one substring
    /// search, so a match costs O(glob × name) at worst, whatever the input.
    ///
    /// Positions are byte offsets into UTF-8 text; they always fall on character
    /// boundaries, because a valid UTF-8 segment can only be found at a character start.
    pub fn matches(&self, name: &str) -> bool {
        let Some((first, rest)) = self.text.split_once('*') else {
            return self.text == name;
        };
        // With one `*`, `rest` is the last segment and there are no middle ones.
        let (middle, last) = rest.rsplit_once('*').unwrap_or(("", rest));
        let Some(mut body) = name
            .strip_prefix(first)
            .and_then(|after| after.strip_suffix(last))
        else {
            return false;
        };
        for segment in middle.split('*').filter(|s| !s.is_empty()) {
            let Some(at) = body.find(segment) else {
                return false;
            };
            body = body.get(at + segment.len()..).unwrap_or_default();
        }
        true
    }
}

/// A list of globs; a name is admitted when any glob matches it. An empty list admits
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    /// In file order; at most [`ALLOW_LIST_GLOBS_MAX`] once loaded from a config file.
    globs: Vec<Glob>,
}

impl AllowList {
    /// A list of the given globs.
    pub fn new(globs: Vec<Glob>) -> Self {
        AllowList { globs }
    }

    /// The globs, in file order.
    pub fn globs(&self) -> &[Glob] {
        &self.globs
    }

    /// Whether some glob matches `name`; always false for an empty list.
    pub fn admits(&self, name: &str) -> bool {
        self.globs.iter().any(|glob| glob.matches(name))
    }
}

/// Whether a resource URI is written the one way a glob can judge: a glob matches text,
/// and an upstream resolves what the text means, so a URI that means the same as another
/// but is written differently would slip past a glob written for the other. Where
/// resource globs decide (a route's `resources`, auth rules), URIs that are not in this
/// form are not admitted. Refused (RFC 3986 §6.2.2, and what file servers fold):
/// - a `.` or `..` path segment, or an empty one inside the path (`a//b`);
/// - a `\\` anywhere; an escape of `/` or `\\` in the path (`%2F`, `%5C`);
/// - before the query, an escape of an unreserved character (`%73` for `s`, `%2E` for
///   `.`), or a `%` not followed by two hex digits;
/// - an upper-case scheme; for `http`, `https`, `ws`, `wss` and `file`, an upper-case
///   letter or a `%` in the authority, an authority ending in `.` or `:`, or the scheme's
///   default port (`:443`, `:80`); a `file:` URI with an authority (`file://localhost/x`
///   for `file:///x`).
///
/// Other schemes' authorities are theirs to read (`repo://Microsoft/TypeScript`), and a
/// URI template's `{…}` expressions (`users://{userId}/profile`) are read as one plain
/// segment each: the URI they expand to is judged when it is asked for. The scheme is
/// what precedes the first `:`, after any `<toolkit>+` (a proxy's agent-visible URIs).
pub fn resource_uri_is_normal(uri: &str) -> bool {
    let plain;
    let uri = if uri.contains('{') {
        plain = without_expressions(uri);
        plain.as_str()
    } else {
        uri
    };
    if uri.contains('\\') {
        return false;
    }
    let (scheme, rest) = match uri.split_once(':') {
        Some((scheme, rest)) if is_scheme(scheme) => {
            // A toolkit prefix (`kit+`) is no part of the scheme.
            (scheme.rsplit('+').next().unwrap_or(scheme), rest)
        }
        _ => ("", uri),
    };
    if scheme.bytes().any(|b| b.is_ascii_uppercase()) {
        return false;
    }
    let hier = rest.split(['?', '#']).next().unwrap_or_default();
    if !escapes_are_normal(hier) {
        return false;
    }
    let path = match hier.strip_prefix("//") {
        Some(after) => {
            let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
            let default_port = match scheme {
                "https" | "wss" => Some("443"),
                "http" | "ws" => Some("80"),
                _ => None,
            };
            let known = default_port.is_some() || scheme == "file";
            let port = authority.rsplit_once(':').map(|(_, port)| port);
            if known
                && (authority
                    .bytes()
                    .any(|b| b.is_ascii_uppercase() || b == b'%')
                    || authority.ends_with(['.', ':'])
                    || (port.is_some() && port == default_port)
                    || (scheme == "file" && !authority.is_empty()))
            {
                return false;
            }
            path
        }
        None => hier,
    };
    if path.contains("%2F") || path.contains("%2f") || path.contains("%5C") || path.contains("%5c")
    {
        return false;
    }
    let segments = path.strip_prefix('/').unwrap_or(path).split('/');
    let count = segments.clone().count();
    !segments
        .enumerate()
        .any(|(n, seg)| seg == "." || seg == ".." || (seg.is_empty() && n + 1 < count))
}

/// `template` with each `{…}` expression replaced by `x` (an unclosed `{` is kept).
fn without_expressions(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest.get(open..).and_then(|r| r.find('}')) else {
            break;
        };
        out.push_str(rest.get(..open).unwrap_or_default());
        out.push('x');
        rest = rest.get(open + close + 1..).unwrap_or_default();
    }
    out.push_str(rest);
    out
}

/// A URI scheme's characters (with `_`, which a toolkit prefix may hold).
fn is_scheme(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.' | b'_'))
}

/// Every `%` starts an escape of two hex digits, and none escapes an unreserved character.
fn escapes_are_normal(uri: &str) -> bool {
    let bytes = uri.as_bytes();
    let mut at = 0;
    while let Some(found) = memchr::memchr(b'%', bytes.get(at..).unwrap_or_default()) {
        let start = at + found;
        let Some(hex) = bytes.get(start + 1..start + 3) else {
            return false;
        };
        let value = std::str::from_utf8(hex)
            .ok()
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match value {
            None => return false,
            Some(b) if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') => {
                return false;
            }
            Some(_) => {}
        }
        at = start + 3;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    #[test]
    fn resource_uris_are_admitted_only_in_normal_form() {
        for good in [
            "file:///docs/readme.md",
            "file:///docs/",
            "file:///",
            "https://example.com/a/b?x=..%2F#frag",
            "https://example.com:8443/a",
            "github+repo://owner/name/issues/1",
            "kit+file:///docs/a%20b",
            "my_kit+file:///x/%C3%BC",
            "urn:isbn:0451450523",
            "mem://store/{id}",
            "file:///a/.hidden/b..c",
            "users://{userId}/profile",
            "note://{noteId}",
            "db://{Table}/rows",
            "repo://Microsoft/TypeScript",
            "https://example.com/a?name=foo%7Ebar",
            "file:///{+path}",
            "https://api.example.com/search{?q,lang}",
        ] {
            assert!(resource_uri_is_normal(good), "{good}");
        }
        for bad in [
            "file:///docs/../etc/passwd",
            "file:///docs/./x",
            "file:///docs/..",
            "file:///docs/%2e%2e/etc/passwd",
            "file:///docs/%2E%2E/etc/passwd",
            "file:///docs/..%2Fetc/passwd",
            "file:///srv//secret/k",
            "file:///srv/%73ecret/k",
            "FILE:///srv/secret/k",
            "kit+FILE:///srv/secret/k",
            "file://localhost/srv/secret/k",
            "file:///srv\\secret",
            "file:///srv/%5Csecret",
            "https://Example.com/secret",
            "https://example.com./secret",
            "https://example.com:443/secret",
            "http://example.com:80/secret",
            "https://example.com:/secret",
            "https://ex%61mple.com/secret",
            "file:///srv/%zz",
            "file:///srv/%4",
            "docs/../x",
            "file:///docs/{x}/../../etc/passwd",
            "file:///docs/../etc/passwd?{q}",
            "https://Example.com/{path}",
        ] {
            assert!(!resource_uri_is_normal(bad), "{bad}");
        }
    }

    #[test]
    fn globs_match_whole_names() {
        let table: &[(&str, &str, bool)] = &[
            ("", "", true),
            ("", "a", false),
            ("*", "", true),
            ("*", "anything at all", true),
            ("**", "", true),
            ("**", "ab", true),
            ("a", "a", true),
            ("a", "ab", false),
            ("a", "", false),
            ("a*", "a", true),
            ("a*", "abc", true),
            ("a*", "ba", false),
            ("a*", "", false),
            ("*a", "a", true),
            ("*a", "cba", true),
            ("*a", "ab", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("a*a", "aba", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("a*b*c", "abcb", false),
            ("a*b*c", "abcbc", true),
            ("*aa*aa*", "aaa", false),
            ("*aa*aa*", "aaaa", true),
            ("*aa*aa*", "aabaa", true),
            ("*ab*ab", "abab", true),
            ("*ab*ab", "abaab", true),
            ("*ab*ab", "aab", false),
            ("search_*", "search_issues", true),
            ("search_*", "search_", true),
            ("search_*", "get_issue", false),
            ("file:///docs/*", "file:///docs/a/b.md", true),
            ("file:///docs/*", "file:///etc/passwd", false),
            // `?` and `[` are literal.
            ("a?c", "abc", false),
            ("a?c", "a?c", true),
            ("[ab]", "a", false),
            // Unicode: `*` spans whole characters, literals compare exactly.
            ("é*", "été", true),
            ("*é", "été", true),
            ("*t*", "été", true),
            ("é*é", "é", false),
            ("日*語", "日本語", true),
            ("日*語", "日本", false),
            ("*🦀*", "a🦀b", true),
            ("e*", "é", false),
        ];
        for &(glob, name, want) in table {
            assert_eq!(Glob::new(glob).matches(name), want, "{glob:?} vs {name:?}");
        }
    }

    #[test]
    fn allow_lists_admit_any_match_and_empty_admits_nothing() {
        let list = AllowList::new(vec![Glob::new("search_*"), Glob::new("get_*")]);
        assert!(list.admits("search_code"));
        assert!(list.admits("get_issue"));
        assert!(!list.admits("create_issue"));
        let empty = AllowList::new(Vec::new());
        assert!(!empty.admits(""));
        assert!(!empty.admits("anything"));
        assert_eq!(list.globs().len(), 2);
    }

    #[test]
    fn long_hostile_names_match_in_linear_passes() {
        // A backtracking matcher takes exponential time here; this one makes one
        // substring search per segment.
        let glob = Glob::new("*a*a*a*a*a*a*a*a*a*a*a*a*b");
        let name = "a".repeat(100_000);
        assert!(!glob.matches(&name));
        assert!(glob.matches(&format!("{name}b")));
    }

    /// The definition, written directly: exponential at worst, fine for short inputs.
    fn naive(glob: &[char], name: &[char]) -> bool {
        match glob.split_first() {
            None => name.is_empty(),
            Some(('*', rest)) => {
                (0..=name.len()).any(|skip| name.get(skip..).is_some_and(|tail| naive(rest, tail)))
            }
            Some((c, rest)) => match name.split_first() {
                Some((n, tail)) => n == c && naive(rest, tail),
                None => false,
            },
        }
    }

    fn random_text(rng: &mut Rng, alphabet: &[char], len_max: u64) -> String {
        let len = rng.below(len_max + 1);
        (0..len).map(|_| rng.pick(alphabet)).collect()
    }

    /// Reproduce a failure with `MCPYARD_SEED=<seed> cargo test --lib config::glob`.
    #[test]
    fn matches_agree_with_the_naive_definition() {
        let (mut rng, seed) = Rng::seeded(0x6c0b_5eed);
        for _ in 0..20_000 {
            let glob = random_text(&mut rng, &['a', 'b', 'é', '*', '*'], 8);
            let name = random_text(&mut rng, &['a', 'b', 'é'], 10);
            let glob_chars: Vec<char> = glob.chars().collect();
            let name_chars: Vec<char> = name.chars().collect();
            assert_eq!(
                Glob::new(glob.as_str()).matches(&name),
                naive(&glob_chars, &name_chars),
                "glob {glob:?} name {name:?} (MCPYARD_SEED={seed})"
            );
        }
    }
}
