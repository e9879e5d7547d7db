//! Tokens of the Python subset TVMScript is written in, with byte spans. Indentation becomes
//! Indent/Dedent tokens; newlines inside brackets are joined, as Python does. The lexer never
//! panics: anything it cannot read is an error at its span.

use crate::diag::{SourceError, Span};

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    Name(String),
    Int(i64),
    Float(f64),
    Str(String),
    /// Punctuation and operators: ( ) [ ] { } , : . = -> @ + - * / // % ** == != < > <= >=
    Op(&'static str),
    Newline,
    Indent,
    Dedent,
    Eof,
}

#[derive(Clone, Debug)]
pub struct Token {
    pub tok: Tok,
    pub span: Span,
}

const OPS: &[&str] = &[
    "->", "//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",", ":", ".", "=", "@", "+", "-", "*",
    "/", "%", "<", ">", ";",
];

pub fn lex(src: &str) -> Result<Vec<Token>, SourceError> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut indents = vec![0usize];
    let mut depth = 0usize; // bracket nesting
    let mut i = 0;
    let mut at_line_start = true;
    while i < bytes.len() {
        if at_line_start && depth == 0 {
            // Measure indentation; blank and comment-only lines do not count.
            let start = i;
            let mut width = 0;
            while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
                width += if bytes[i] == b'\t' { 8 - width % 8 } else { 1 };
                i += 1;
            }
            if i >= bytes.len() || bytes[i] == b'\n' || bytes[i] == b'\r' || bytes[i] == b'#' {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                i += 1;
                continue;
            }
            at_line_start = false;
            let current = *indents.last().unwrap_or(&0);
            if width > current {
                indents.push(width);
                out.push(Token { tok: Tok::Indent, span: Span::new(start, i) });
            } else {
                while width < *indents.last().unwrap_or(&0) {
                    indents.pop();
                    out.push(Token { tok: Tok::Dedent, span: Span::new(i, i) });
                }
                if width != *indents.last().unwrap_or(&0) {
                    return Err(SourceError::new(
                        Span::new(start, i),
                        "this line's indentation matches no outer block",
                    ));
                }
            }
        }
        let c = bytes[i];
        let start = i;
        match c {
            b' ' | b'\t' | b'\r' => i += 1,
            b'\\' if bytes.get(i + 1) == Some(&b'\n') => i += 2,
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'\n' => {
                i += 1;
                if depth == 0 {
                    if !matches!(out.last().map(|t: &Token| &t.tok), Some(Tok::Newline) | None) {
                        out.push(Token { tok: Tok::Newline, span: Span::new(start, i) });
                    }
                    at_line_start = true;
                }
            }
            b'"' | b'\'' => {
                let (s, end) = string(src, i)?;
                out.push(Token { tok: Tok::Str(s), span: Span::new(start, end) });
                i = end;
            }
            b'0'..=b'9' => {
                let (tok, end) = number(src, i)?;
                out.push(Token { tok, span: Span::new(start, end) });
                i = end;
            }
            c if c == b'_' || c.is_ascii_alphabetic() || c >= 0x80 => {
                while i < bytes.len() && (bytes[i] == b'_' || bytes[i].is_ascii_alphanumeric() || bytes[i] >= 0x80) {
                    i += 1;
                }
                // Python string prefixes (r"", b"") are not in the subset.
                out.push(Token { tok: Tok::Name(src[start..i].to_string()), span: Span::new(start, i) });
            }
            _ => {
                let rest = &src[i..];
                let Some(op) = OPS.iter().find(|op| rest.starts_with(**op)) else {
                    let ch = rest.chars().next().unwrap_or('?');
                    return Err(SourceError::new(
                        Span::new(i, i + ch.len_utf8()),
                        format!("unexpected character {ch:?}"),
                    ));
                };
                match *op {
                    "(" | "[" | "{" => depth += 1,
                    ")" | "]" | "}" => depth = depth.saturating_sub(1),
                    _ => {}
                }
                i += op.len();
                out.push(Token { tok: Tok::Op(op), span: Span::new(start, i) });
            }
        }
    }
    let end = src.len();
    if !matches!(out.last().map(|t| &t.tok), Some(Tok::Newline) | None) {
        out.push(Token { tok: Tok::Newline, span: Span::new(end, end) });
    }
    while indents.len() > 1 {
        indents.pop();
        out.push(Token { tok: Tok::Dedent, span: Span::new(end, end) });
    }
    out.push(Token { tok: Tok::Eof, span: Span::new(end, end) });
    Ok(out)
}

fn string(src: &str, start: usize) -> Result<(String, usize), SourceError> {
    let bytes = src.as_bytes();
    let quote = bytes[start];
    let triple = bytes.get(start + 1) == Some(&quote) && bytes.get(start + 2) == Some(&quote);
    let mut i = start + if triple { 3 } else { 1 };
    let mut out = String::new();
    loop {
        let Some(&c) = bytes.get(i) else {
            return Err(SourceError::new(Span::new(start, src.len()), "unterminated string"));
        };
        if c == quote && (!triple || (bytes.get(i + 1) == Some(&quote) && bytes.get(i + 2) == Some(&quote))) {
            return Ok((out, i + if triple { 3 } else { 1 }));
        }
        if c == b'\n' && !triple {
            return Err(SourceError::new(Span::new(start, i), "unterminated string"));
        }
        if c == b'\\' {
            let esc = bytes.get(i + 1).copied().unwrap_or(b'\\');
            out.push(match esc {
                b'n' => '\n',
                b't' => '\t',
                b'\\' => '\\',
                b'\'' => '\'',
                b'"' => '"',
                b'0' => '\0',
                _ => return Err(SourceError::new(Span::new(i, i + 2), "unsupported escape sequence")),
            });
            i += 2;
            continue;
        }
        let ch = src[i..].chars().next().unwrap_or('?');
        out.push(ch);
        i += ch.len_utf8();
    }
}

fn number(src: &str, start: usize) -> Result<(Tok, usize), SourceError> {
    let bytes = src.as_bytes();
    let mut i = start;
    let mut float = false;
    while i < bytes.len() {
        match bytes[i] {
            b'0'..=b'9' | b'_' => i += 1,
            b'.' if !float && bytes.get(i + 1).is_none_or(|b| b.is_ascii_digit()) => {
                float = true;
                i += 1;
            }
            b'e' | b'E' => {
                float = true;
                i += 1;
                if matches!(bytes.get(i), Some(b'+' | b'-')) {
                    i += 1;
                }
            }
            _ => break,
        }
    }
    let text: String = src[start..i].chars().filter(|c| *c != '_').collect();
    let span = Span::new(start, i);
    if float {
        text.parse().map(|v| (Tok::Float(v), i)).map_err(|_| SourceError::new(span, format!("bad number {text}")))
    } else {
        text.parse()
            .map(|v| (Tok::Int(v), i))
            .map_err(|_| SourceError::new(span, format!("integer {text} is out of range")))
    }
}
