//! A small reader for the nginx configuration grammar: directives (`name args…;`), blocks
//! (`name args… { … }`), single and double quotes with `\` escapes, `#` comments. Enough for
//! `tollgate import nginx`; not the hot path, so it favours plain code and line numbers.

use super::output::ImportError;

/// One directive, with its block when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    pub name: String,
    pub args: Vec<String>,
    pub line: usize,
    pub block: Option<Vec<Directive>>,
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String, usize),
    Semi(usize),
    Open(usize),
    Close(usize),
}

fn tokens(file: &str, text: &str) -> Result<Vec<Token>, ImportError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    let err = |line, message: &str| ImportError::Syntax {
        file: file.to_owned(),
        line,
        message: message.to_owned(),
    };
    while let Some(&c) = chars.peek() {
        match c {
            '\n' => {
                line += 1;
                chars.next();
            }
            c if c.is_whitespace() => {
                chars.next();
            }
            '#' => {
                while let Some(&c) = chars.peek() {
                    if c == '\n' {
                        break;
                    }
                    chars.next();
                }
            }
            ';' => {
                out.push(Token::Semi(line));
                chars.next();
            }
            '{' => {
                out.push(Token::Open(line));
                chars.next();
            }
            '}' => {
                out.push(Token::Close(line));
                chars.next();
            }
            '"' | '\'' => {
                let quote = c;
                let start = line;
                chars.next();
                let mut word = String::new();
                loop {
                    match chars.next() {
                        None => return Err(err(start, "unterminated quoted string")),
                        Some('\\') => match chars.next() {
                            Some(e) if e == quote || e == '\\' => word.push(e),
                            Some(e) => {
                                word.push('\\');
                                word.push(e);
                            }
                            None => return Err(err(start, "unterminated quoted string")),
                        },
                        Some(c) if c == quote => break,
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            word.push(c);
                        }
                    }
                }
                out.push(Token::Word(word, start));
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == ';' || c == '{' || c == '}' {
                        break;
                    }
                    // `${var}` keeps its braces inside a word.
                    if c == '$' {
                        word.push(c);
                        chars.next();
                        if chars.peek() == Some(&'{') {
                            for c in chars.by_ref() {
                                word.push(c);
                                if c == '}' {
                                    break;
                                }
                            }
                        }
                        continue;
                    }
                    word.push(c);
                    chars.next();
                }
                out.push(Token::Word(word, line));
            }
        }
    }
    Ok(out)
}

/// The deepest nesting of blocks read. nginx's own configs nest a handful deep (`http`,
/// `server`, `location`, a nested `location`, `if`); the bound keeps the reader's recursion
/// (and the importer's, which follows it) far from the end of the stack.
pub const MAX_DEPTH: usize = 64;

/// Parses `text` into its top-level directives.
pub fn parse(file: &str, text: &str) -> Result<Vec<Directive>, ImportError> {
    let toks = tokens(file, text)?;
    let mut pos = 0;
    let list = block(file, &toks, &mut pos, None, 0)?;
    Ok(list)
}

fn block(
    file: &str,
    toks: &[Token],
    pos: &mut usize,
    opened: Option<usize>,
    depth: usize,
) -> Result<Vec<Directive>, ImportError> {
    let err = |line, message: &str| ImportError::Syntax {
        file: file.to_owned(),
        line,
        message: message.to_owned(),
    };
    let mut out = Vec::new();
    loop {
        let Some(t) = toks.get(*pos) else {
            return match opened {
                Some(line) => Err(err(line, "this `{` is never closed")),
                None => Ok(out),
            };
        };
        *pos += 1;
        match t {
            Token::Close(line) => {
                return match opened {
                    Some(_) => Ok(out),
                    None => Err(err(*line, "unexpected `}`")),
                }
            }
            Token::Semi(line) => return Err(err(*line, "unexpected `;`")),
            Token::Open(line) => return Err(err(*line, "a block without a directive name")),
            Token::Word(name, line) => {
                let mut args = Vec::new();
                loop {
                    match toks.get(*pos) {
                        Some(Token::Word(w, _)) => {
                            args.push(w.clone());
                            *pos += 1;
                        }
                        Some(Token::Semi(_)) => {
                            *pos += 1;
                            out.push(Directive {
                                name: name.clone(),
                                args,
                                line: *line,
                                block: None,
                            });
                            break;
                        }
                        Some(Token::Open(l)) => {
                            *pos += 1;
                            if depth >= MAX_DEPTH {
                                return Err(err(
                                    *l,
                                    &format!("blocks nested deeper than {MAX_DEPTH}"),
                                ));
                            }
                            let inner = block(file, toks, pos, Some(*l), depth + 1)?;
                            out.push(Directive {
                                name: name.clone(),
                                args,
                                line: *line,
                                block: Some(inner),
                            });
                            break;
                        }
                        Some(Token::Close(l)) => {
                            return Err(err(*l, &format!("`{name}` is not ended by `;`")))
                        }
                        None => return Err(err(*line, &format!("`{name}` is not ended by `;`"))),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_blocks_quotes_comments() {
        let conf = "http { # c\n  limit_req_zone $binary_remote_addr zone=one:10m rate=1r/s;\n  server {\n    add_header X-A \"a ; b\" always;\n    location = /x { return 301 'https://e/$request_uri'; }\n  }\n}\n";
        let d = parse("f", conf).expect("parses");
        assert_eq!(d.len(), 1);
        let http = d[0].block.as_ref().expect("block");
        assert_eq!(http[0].name, "limit_req_zone");
        assert_eq!(http[0].line, 2);
        let server = http[1].block.as_ref().expect("server block");
        assert_eq!(server[0].args, vec!["X-A", "a ; b", "always"]);
        assert_eq!(server[1].args, vec!["=", "/x"]);
        assert_eq!(server[1].line, 5);
    }

    #[test]
    fn nesting_is_bounded() {
        let ok = format!("{}{}", "a {\n".repeat(MAX_DEPTH), "}\n".repeat(MAX_DEPTH));
        assert!(parse("f", &ok).is_ok());
        let deep = format!(
            "{}{}",
            "a {\n".repeat(MAX_DEPTH + 1),
            "}\n".repeat(MAX_DEPTH + 1)
        );
        let e = parse("f", &deep).expect_err("too deep");
        assert!(e.to_string().contains("nested deeper"), "{e}");
    }

    #[test]
    fn errors_have_lines() {
        let e = parse("f", "http {\n  server {\n}\n").expect_err("unclosed");
        assert!(e.to_string().starts_with("f:1:"), "{e}");
        let e = parse("f", "a b\n}").expect_err("no semicolon");
        assert!(e.to_string().contains("f:2:"), "{e}");
    }
}
