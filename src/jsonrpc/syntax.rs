//! JSON syntax (RFC 8259) over a whole buffer, in one pass with no allocation below 64
//! levels of nesting: the checker behind [`super::parse_envelope`] and [`super::Raw::parse`].
//!
//! It accepts exactly what `serde_json` accepts when it reads a value without keeping it
//! (`IgnoredAny`, `RawValue`): whitespace is space, tab, LF and CR; strings hold no raw
//! control byte and only the escapes `\" \\ \/ \b \f \n \r \t \uXXXX` (a `\u` escape is
//! four hex digits, surrogates unpaired or not); numbers follow the §6 grammar with no range
//! check; `true`, `false`, `null` are spelled out; brackets balance, with no trailing comma.
//! Nesting depth is not limited (as in `serde_json`'s ignoring reader): each level costs a
//! bit, so a body's depth costs at most its length / 8 bytes. UTF-8 is the caller's check
//! (the input is a `str`).

use super::scan::plain_run;

/// Not JSON (where exactly does not matter: the answer is a parse error either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Syntax;

/// Open containers, innermost last, a bit each (set: object, clear: array).
struct Nesting {
    depth: usize,
    inline: u64,
    /// Levels past the 64 of `inline`. Invariant: `spill.len() * 64 >= depth - 64`.
    spill: Vec<u64>,
}

impl Nesting {
    fn new() -> Nesting {
        Nesting {
            depth: 0,
            inline: 0,
            spill: Vec::new(),
        }
    }

    fn push(&mut self, object: bool) {
        let bit = u64::from(object);
        match self.depth.checked_sub(64) {
            None => {
                self.inline = (self.inline & !(1 << self.depth)) | (bit << self.depth);
            }
            Some(deep) => {
                let (word, at) = (deep / 64, deep % 64);
                if word == self.spill.len() {
                    self.spill.push(0);
                }
                if let Some(w) = self.spill.get_mut(word) {
                    *w = (*w & !(1 << at)) | (bit << at);
                }
            }
        }
        self.depth += 1;
    }

    /// Whether the innermost open container is an object; `None` when none is open.
    fn top(&self) -> Option<bool> {
        let level = self.depth.checked_sub(1)?;
        Some(match level.checked_sub(64) {
            None => self.inline >> level & 1 == 1,
            Some(deep) => self
                .spill
                .get(deep / 64)
                .is_some_and(|w| w >> (deep % 64) & 1 == 1),
        })
    }

    fn pop(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }
}

/// A position in a buffer being checked.
pub(super) struct Cursor<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(text: &'a str) -> Cursor<'a> {
        Cursor {
            text,
            bytes: text.as_bytes(),
            at: 0,
        }
    }

    /// The text from `start` to where the cursor is.
    pub(super) fn since(&self, start: usize) -> Result<&'a str, Syntax> {
        self.text.get(start..self.at).ok_or(Syntax)
    }

    /// Reads one object (the cursor at its `{`). For each member, `member` gets the name's
    /// lexeme (quotes included), whether it has escapes, and the cursor at the member's
    /// value, which it must read (with [`Cursor::value`], or member by member).
    pub(super) fn object(
        &mut self,
        mut member: impl FnMut(&'a str, bool, &mut Cursor<'a>) -> Result<(), Syntax>,
    ) -> Result<(), Syntax> {
        self.eat(b'{')?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            let start = self.at;
            let escaped = self.string()?;
            let name = self.since(start)?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            member(name, escaped, self)?;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.at += 1;
                    self.ws();
                }
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Syntax),
            }
        }
    }

    /// Where the cursor is (a byte offset into the text).
    pub(super) fn at(&self) -> usize {
        self.at
    }

    /// True once every byte has been read.
    pub(super) fn at_end(&self) -> bool {
        self.at >= self.bytes.len()
    }

    pub(super) fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    /// Skips JSON whitespace.
    pub(super) fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Reads `byte`, or fails.
    pub(super) fn eat(&mut self, byte: u8) -> Result<(), Syntax> {
        if self.peek() != Some(byte) {
            return Err(Syntax);
        }
        self.at += 1;
        Ok(())
    }

    /// Reads one string, quotes included; true when it has escapes.
    pub(super) fn string(&mut self) -> Result<bool, Syntax> {
        self.eat(b'"')?;
        let mut escaped = false;
        loop {
            self.at += plain_run(self.bytes.get(self.at..).unwrap_or_default());
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    match self.bytes.get(self.at + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.at += 2;
                        }
                        Some(b'u') => {
                            let hex = self.bytes.get(self.at + 2..self.at + 6).ok_or(Syntax)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return Err(Syntax);
                            }
                            self.at += 6;
                        }
                        _ => return Err(Syntax),
                    }
                }
                // A control byte, or the end of the text.
                _ => return Err(Syntax),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> Result<(), Syntax> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(Syntax),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return Err(Syntax);
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(Syntax);
            }
        }
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Syntax> {
        if self.bytes.get(self.at..self.at + word.len()) != Some(word) {
            return Err(Syntax);
        }
        self.at += word.len();
        Ok(())
    }

    /// Reads a member name and the `:` after it (whitespace around both skipped).
    fn name(&mut self) -> Result<(), Syntax> {
        self.ws();
        self.string()?;
        self.ws();
        self.eat(b':')
    }

    /// Reads one value (whitespace before it skipped, none after it read).
    pub(super) fn value(&mut self) -> Result<(), Syntax> {
        let mut nesting = Nesting::new();
        loop {
            // A value starts here.
            self.ws();
            match self.peek() {
                Some(b'{') => {
                    self.at += 1;
                    self.ws();
                    if self.peek() == Some(b'}') {
                        self.at += 1;
                    } else {
                        nesting.push(true);
                        self.name()?;
                        continue;
                    }
                }
                Some(b'[') => {
                    self.at += 1;
                    self.ws();
                    if self.peek() == Some(b']') {
                        self.at += 1;
                    } else {
                        nesting.push(false);
                        continue;
                    }
                }
                Some(b'"') => {
                    self.string()?;
                }
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(b'-' | b'0'..=b'9') => self.number()?,
                _ => return Err(Syntax),
            }
            // A value ended: close what it ends, or move to the next one.
            loop {
                let Some(object) = nesting.top() else {
                    return Ok(());
                };
                self.ws();
                match (self.peek(), object) {
                    (Some(b','), true) => {
                        self.at += 1;
                        self.name()?;
                        break;
                    }
                    (Some(b','), false) => {
                        self.at += 1;
                        break;
                    }
                    (Some(b'}'), true) | (Some(b']'), false) => {
                        self.at += 1;
                        nesting.pop();
                    }
                    _ => return Err(Syntax),
                }
            }
        }
    }
}

/// Checks that `text` is one JSON value with only whitespace around it; gives the value's
/// span.
pub(super) fn value_span(text: &str) -> Result<(usize, usize), Syntax> {
    let mut cursor = Cursor::new(text);
    cursor.ws();
    let start = cursor.at();
    cursor.value()?;
    let end = cursor.at();
    cursor.ws();
    if !cursor.at_end() {
        return Err(Syntax);
    }
    Ok((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;
    use serde_json::value::RawValue;

    /// What serde_json's ignoring reader says about `text`, as a span.
    fn serde_span(text: &str) -> Option<(usize, usize)> {
        let raw: &RawValue = serde_json::from_str(text).ok()?;
        let start = raw.get().as_ptr() as usize - text.as_ptr() as usize;
        Some((start, start + raw.get().len()))
    }

    #[test]
    fn agrees_with_serde_json_on_a_table() {
        let cases = [
            "",
            " ",
            "{}",
            "[]",
            " {} ",
            "{ }",
            "[ ]",
            "{,}",
            "[,]",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{1:2}",
            "{\"a\":}",
            "[1 2]",
            "01",
            "-",
            "-0",
            "0.",
            "0.5",
            ".5",
            "1e",
            "1e+",
            "1E-7",
            "1.5e10",
            "-12.0e+3",
            "tru",
            "true",
            "truex",
            "nul",
            "null",
            "false",
            "\"\"",
            "\"a",
            "\"\\u12\"",
            "\"\\u12g4\"",
            "\"\\ud800\"",
            "\"\\x\"",
            "\"\\/\"",
            "\"tab\there\"",
            "\"ctl\u{1}\"",
            "\"é\"",
            "[[[[]]]]",
            "[[[[]]]",
            "{\"a\":[{\"b\":{}}]}",
            "{\"a\":[{\"b\":{}]}}",
            "[1]x",
            "[1] ",
            "\t[1]\r\n",
            "{\"a\":1}{",
            "[\"]\"]",
            "{\"}\":\"{\"}",
            "[true,false,null]",
            "1 2",
            "[01]",
            "[-]",
            "[1.]",
            "[\"\\\"\"]",
        ];
        for text in cases {
            assert_eq!(value_span(text).ok(), serde_span(text), "{text:?}");
        }
    }

    #[test]
    fn nesting_deeper_than_the_inline_bits_is_followed_exactly() {
        for depth in [63, 64, 65, 127, 128, 129, 200, 5000] {
            let ok =
                format!("{}{}", "[{\"a\":".repeat(depth), "}]".repeat(depth)).replace(":}", ":1}");
            assert_eq!(value_span(&ok).ok(), serde_span(&ok), "depth {depth}");
            assert!(value_span(&ok).is_ok(), "depth {depth}");
            // The same with one closer swapped: must fail at any depth.
            let bad = ok.replacen("}]", "]}", 1);
            assert!(value_span(&bad).is_err(), "depth {depth}");
        }
    }

    /// Random mutations of valid documents: whatever serde_json says, we say.
    #[test]
    fn agrees_with_serde_json_on_mutated_documents() {
        const ROUNDS: usize = 20_000;
        const SEEDS: &[&str] = &[
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi \"there\" \\ \u00e9","n":[1,-2.5e3,true,false,null]}}}"#,
            r#"[{"a":[]},{"b":{"c":[[{}]]}},"\ud83d\ude00",0,-0.0,1E+2]"#,
            r#"  {"k" : "v" , "l" : [ 1 , 2 ] }  "#,
        ];
        const BYTES: &[u8] = b"{}[]\",:\\ \t\n\r0123456789-+.eEtrufalsn\x01\x7fu";
        let (mut rng, seed) = Rng::seeded(0x5eed_0e57);
        for round in 0..ROUNDS {
            let bytes = crate::testing::mutated(&mut rng, SEEDS, BYTES);
            let Ok(text) = std::str::from_utf8(&bytes) else {
                continue;
            };
            assert_eq!(
                value_span(text).ok(),
                serde_span(text),
                "seed {seed} round {round}: {text:?}"
            );
        }
    }
}
