//! A parser for git-config/gcfg INI files, the syntax of the upstream
//! plugins' cloud.conf.
//!
//! Section and key names are case-insensitive, subsection names
//! (`[Global "region-one"]`) are case-sensitive. Values may be double-quoted;
//! inside quotes `;` and `#` are literal and `\"`, `\\`, `\n`, `\t` are
//! escapes. Outside quotes `;` or `#` starts a comment. A key without `=`
//! is a boolean `true`.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Lower-cased key.
    pub key: String,
    pub value: String,
    pub file: PathBuf,
    pub line: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Lower-cased section name.
    pub name: String,
    /// The name as first written, for messages.
    pub written_name: String,
    pub subsection: Option<String>,
    pub entries: Vec<Entry>,
    pub file: PathBuf,
    pub line: usize,
}

impl Section {
    /// The last value given for `key` (later lines and files win).
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().rev().find(|e| e.key == key)
    }
}

/// Sections of one or more files, in order of appearance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Document {
    pub sections: Vec<Section>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {message}", file.display())]
pub struct ParseError {
    pub file: PathBuf,
    pub line: usize,
    pub message: String,
}

impl Document {
    /// Parses `text` read from `file` and appends its sections; a section
    /// that appears again (in this or an earlier file) is merged so that
    /// later values win.
    pub fn parse_into(&mut self, file: &Path, text: &str) -> Result<(), ParseError> {
        let mut current: Option<usize> = None;
        for (idx, raw) in text.lines().enumerate() {
            let line_no = idx + 1;
            let err = |message: String| ParseError {
                file: file.to_path_buf(),
                line: line_no,
                message,
            };
            let line = raw.trim();
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let (written, sub) = parse_section_header(rest).map_err(err)?;
                current = Some(self.section_index(written, sub, file, line_no));
                continue;
            }
            let Some(section) = current else {
                return Err(err("a key appears before any [section]".into()));
            };
            let (key, value) = parse_assignment(line).map_err(err)?;
            self.sections[section].entries.push(Entry {
                key,
                value,
                file: file.to_path_buf(),
                line: line_no,
            });
        }
        Ok(())
    }

    fn section_index(
        &mut self,
        written_name: String,
        sub: Option<String>,
        file: &Path,
        line: usize,
    ) -> usize {
        let name = written_name.to_ascii_lowercase();
        if let Some(i) = self
            .sections
            .iter()
            .position(|s| s.name == name && s.subsection == sub)
        {
            return i;
        }
        self.sections.push(Section {
            name,
            written_name,
            subsection: sub,
            entries: Vec::new(),
            file: file.to_path_buf(),
            line,
        });
        self.sections.len() - 1
    }

    pub fn sections_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Section> + 'a {
        self.sections.iter().filter(move |s| s.name == name)
    }

    pub fn section(&self, name: &str, sub: Option<&str>) -> Option<&Section> {
        self.sections
            .iter()
            .find(|s| s.name == name && s.subsection.as_deref() == sub)
    }
}

fn parse_section_header(rest: &str) -> Result<(String, Option<String>), String> {
    let close = find_unquoted(rest, ']').ok_or("section header lacks ']'")?;
    let trailing = rest[close + 1..].trim();
    if !trailing.is_empty() && !trailing.starts_with(';') && !trailing.starts_with('#') {
        return Err(format!(
            "unexpected text after section header: {trailing:?}"
        ));
    }
    let inner = rest[..close].trim();
    let (name, sub) = match inner.find(|c: char| c.is_whitespace()) {
        None => (inner, None),
        Some(sp) => {
            let sub = inner[sp..].trim();
            let unquoted = sub
                .strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .ok_or_else(|| format!("subsection name must be quoted: {sub:?}"))?;
            (&inner[..sp], Some(unescape(unquoted)?))
        }
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err(format!("invalid section name {name:?}"));
    }
    Ok((name.to_string(), sub))
}

fn parse_assignment(line: &str) -> Result<(String, String), String> {
    let (key, value) = match line.find('=') {
        Some(eq) => (line[..eq].trim(), Some(&line[eq + 1..])),
        None => {
            // a lone key is boolean true; strip a trailing comment
            let end = line.find([';', '#']).unwrap_or(line.len());
            (line[..end].trim(), None)
        }
    };
    if key.is_empty()
        || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        || !key.starts_with(|c: char| c.is_ascii_alphabetic())
    {
        return Err(format!("invalid key name {key:?}"));
    }
    let value = match value {
        None => "true".to_string(),
        Some(v) => parse_value(v)?,
    };
    Ok((key.to_ascii_lowercase(), value))
}

/// A value: unquoted runs have surrounding blanks trimmed and inner
/// whitespace kept; quoted runs are taken literally (with escapes); a `;` or
/// `#` outside quotes ends the value.
fn parse_value(v: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut pending_ws = String::new();
    let mut chars = v.trim_start().chars();
    let mut in_quotes = false;
    while let Some(c) = chars.next() {
        if in_quotes {
            match c {
                '"' => in_quotes = false,
                '\\' => out.push(unescape_char(chars.next())?),
                c => out.push(c),
            }
            continue;
        }
        match c {
            ';' | '#' => break,
            '"' => {
                out.push_str(&pending_ws);
                pending_ws.clear();
                in_quotes = true;
            }
            '\\' => {
                out.push_str(&pending_ws);
                pending_ws.clear();
                out.push(unescape_char(chars.next())?);
            }
            c if c.is_whitespace() => pending_ws.push(c),
            c => {
                out.push_str(&pending_ws);
                pending_ws.clear();
                out.push(c);
            }
        }
    }
    if in_quotes {
        return Err("unterminated quoted value".into());
    }
    Ok(out)
}

fn unescape_char(c: Option<char>) -> Result<char, String> {
    match c {
        Some('"') => Ok('"'),
        Some('\\') => Ok('\\'),
        Some('n') => Ok('\n'),
        Some('t') => Ok('\t'),
        Some('b') => Ok('\u{8}'),
        Some(c) => Err(format!("unknown escape sequence \\{c}")),
        None => Err("a value ends with a lone backslash".into()),
    }
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            out.push(unescape_char(chars.next())?);
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

fn find_unquoted(s: &str, needle: char) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '"' => in_quotes = !in_quotes,
            c if c == needle && !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Document, ParseError> {
        let mut d = Document::default();
        d.parse_into(Path::new("cloud.conf"), text)?;
        Ok(d)
    }

    fn value(d: &Document, sec: &str, sub: Option<&str>, key: &str) -> Option<String> {
        d.section(sec, sub)
            .and_then(|s| s.get(key))
            .map(|e| e.value.clone())
    }

    #[test]
    fn table() {
        struct Case {
            text: &'static str,
            key: &'static str,
            want: Result<&'static str, &'static str>,
        }
        let cases = [
            Case {
                text: "[Global]\npassword = plain",
                key: "password",
                want: Ok("plain"),
            },
            Case {
                text: "[Global]\npassword = \"semi;colon#hash\"",
                key: "password",
                want: Ok("semi;colon#hash"),
            },
            Case {
                text: "[Global]\npassword = trailing ; comment",
                key: "password",
                want: Ok("trailing"),
            },
            Case {
                text: "[Global]\npassword = a # comment",
                key: "password",
                want: Ok("a"),
            },
            Case {
                text: "[Global]\npassword = \"esc\\\"aped\\\\\"",
                key: "password",
                want: Ok("esc\"aped\\"),
            },
            Case {
                text: "[Global]\npassword = inner  spaces kept  ",
                key: "password",
                want: Ok("inner  spaces kept"),
            },
            Case {
                text: "[Global]\npassword = pre\"  quoted  \"post",
                key: "password",
                want: Ok("pre  quoted  post"),
            },
            Case {
                text: "[Global]\npassword =",
                key: "password",
                want: Ok(""),
            },
            Case {
                text: "[global]\nPassWord = x",
                key: "password",
                want: Ok("x"),
            },
            Case {
                text: "[Global]\ntls-insecure",
                key: "tls-insecure",
                want: Ok("true"),
            },
            Case {
                text: "[Global]\npassword = \"open",
                key: "password",
                want: Err("unterminated"),
            },
            Case {
                text: "password = x",
                key: "password",
                want: Err("before any [section]"),
            },
            Case {
                text: "[Global\npassword = x",
                key: "password",
                want: Err("lacks ']'"),
            },
            Case {
                text: "[Global]\n= x",
                key: "password",
                want: Err("invalid key name"),
            },
            Case {
                text: "[Global]\npass word = x",
                key: "password",
                want: Err("invalid key name"),
            },
            Case {
                text: "[Global]\npassword = bad\\q",
                key: "password",
                want: Err("unknown escape"),
            },
            Case {
                text: "[Global region]\npassword = x",
                key: "password",
                want: Err("must be quoted"),
            },
        ];
        for c in cases {
            let got = parse(c.text);
            match (got, c.want) {
                (Ok(d), Ok(w)) => assert_eq!(
                    value(&d, "global", None, c.key).as_deref(),
                    Some(w),
                    "{:?}",
                    c.text
                ),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{:?}: {e}", c.text),
                (got, want) => panic!("{:?}: got {got:?}, want {want:?}", c.text),
            }
        }
    }

    #[test]
    fn subsections_and_merge_later_wins() {
        let mut d = Document::default();
        d.parse_into(
            Path::new("a.conf"),
            "[Global]\nusername = a\n[Global \"region-one\"]\nusername = one\n[BlockStorage]\nrescan-on-resize = false\n",
        )
        .unwrap();
        d.parse_into(
            Path::new("b.conf"),
            "[Global]\nusername = b\n[BlockStorage]\nrescan-on-resize = true\n",
        )
        .unwrap();
        assert_eq!(value(&d, "global", None, "username").as_deref(), Some("b"));
        assert_eq!(
            value(&d, "global", Some("region-one"), "username").as_deref(),
            Some("one")
        );
        let e = d
            .section("blockstorage", None)
            .unwrap()
            .get("rescan-on-resize")
            .unwrap();
        assert_eq!(
            (e.value.as_str(), e.file.to_str(), e.line),
            ("true", Some("b.conf"), 4)
        );
        assert_eq!(d.sections_named("global").count(), 2);
    }

    #[test]
    fn error_names_file_and_line() {
        let e = parse("[Global]\n\n  bad key = 1").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.to_string().starts_with("cloud.conf:3:"), "{e}");
    }
}
