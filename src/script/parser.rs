//! A recursive-descent parser for the Python statements and expressions TVMScript uses,
//! producing a plain syntax tree with spans. What the names mean (R.add, R.Tensor, ...) is decided
//! later, in `convert`. Nesting depth is bounded, so hostile input cannot overflow the stack.

use super::lexer::{Tok, Token, lex};
use crate::diag::{SourceError, Span};

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Name(String, Span),
    Attr(Box<Expr>, String, Span),
    Call { func: Box<Expr>, args: Vec<Expr>, kwargs: Vec<(String, Expr)>, span: Span },
    Tuple(Vec<Expr>, Span),
    List(Vec<Expr>, Span),
    Int(i64, Span),
    Float(f64, Span),
    Str(String, Span),
    Bool(bool, Span),
    None(Span),
    BinOp { op: &'static str, lhs: Box<Expr>, rhs: Box<Expr>, span: Span },
    Neg(Box<Expr>, Span),
    Subscript { value: Box<Expr>, index: Box<Expr>, span: Span },
}

impl Expr {
    pub fn span(&self) -> Span {
        match self {
            Expr::Name(_, s)
            | Expr::Attr(_, _, s)
            | Expr::Tuple(_, s)
            | Expr::List(_, s)
            | Expr::Int(_, s)
            | Expr::Float(_, s)
            | Expr::Str(_, s)
            | Expr::Bool(_, s)
            | Expr::None(s)
            | Expr::Neg(_, s) => *s,
            Expr::Call { span, .. } | Expr::BinOp { span, .. } | Expr::Subscript { span, .. } => *span,
        }
    }

    /// `a.b.c` as "a.b.c", for matching names like `R.call_dps_packed`.
    pub fn dotted(&self) -> Option<String> {
        match self {
            Expr::Name(n, _) => Some(n.clone()),
            Expr::Attr(base, attr, _) => Some(format!("{}.{attr}", base.dotted()?)),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub annotation: Option<Expr>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FunctionDef {
    pub decorators: Vec<Expr>,
    pub name: String,
    pub name_span: Span,
    pub params: Vec<Param>,
    pub ret: Option<Expr>,
    pub body: Vec<Stmt>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `targets = value`, `name: annotation = value`; several targets unpack a tuple.
    Assign {
        targets: Vec<(String, Span)>,
        annotation: Option<Expr>,
        value: Expr,
        span: Span,
    },
    Expr(Expr),
    Return(Option<Expr>, Span),
    If {
        cond: Expr,
        then: Vec<Stmt>,
        otherwise: Vec<Stmt>,
        span: Span,
    },
    With {
        context: Expr,
        body: Vec<Stmt>,
        span: Span,
    },
    Function(FunctionDef),
    Class {
        decorators: Vec<Expr>,
        name: String,
        body: Vec<Stmt>,
        span: Span,
    },
    Skipped(Span),
}

const MAX_DEPTH: usize = 200;

/// Keyword arguments of a call, in order.
type Keywords = Vec<(String, Expr)>;

pub fn parse(src: &str) -> Result<Vec<Stmt>, SourceError> {
    let tokens = lex(src)?;
    let mut p = Parser { tokens, pos: 0, depth: 0 };
    let mut out = Vec::new();
    while !p.at(&Tok::Eof) {
        if p.eat(&Tok::Newline) {
            continue;
        }
        out.push(p.statement()?);
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }
    fn peek_at(&self, k: usize) -> &Tok {
        &self.tokens[(self.pos + k).min(self.tokens.len() - 1)].tok
    }
    fn at(&self, t: &Tok) -> bool {
        &self.peek().tok == t
    }
    fn at_op(&self, op: &str) -> bool {
        matches!(&self.peek().tok, Tok::Op(o) if *o == op)
    }
    fn at_name(&self, name: &str) -> bool {
        matches!(&self.peek().tok, Tok::Name(n) if n == name)
    }
    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() - 1 {
            self.pos += 1;
        }
        t
    }
    fn eat(&mut self, t: &Tok) -> bool {
        if self.at(t) {
            self.bump();
            true
        } else {
            false
        }
    }
    fn eat_op(&mut self, op: &str) -> bool {
        if self.at_op(op) {
            self.bump();
            true
        } else {
            false
        }
    }
    fn error(&self, what: impl Into<String>) -> SourceError {
        SourceError::new(self.peek().span, what)
    }
    fn expect_op(&mut self, op: &str) -> Result<Span, SourceError> {
        if self.at_op(op) { Ok(self.bump().span) } else { Err(self.error(format!("expected `{op}` here"))) }
    }
    fn expect_name(&mut self) -> Result<(String, Span), SourceError> {
        match self.bump() {
            Token { tok: Tok::Name(n), span } => Ok((n, span)),
            t => Err(SourceError::new(t.span, "expected a name here")),
        }
    }
    fn expect_newline(&mut self) -> Result<(), SourceError> {
        if self.eat(&Tok::Newline) || self.at(&Tok::Eof) || self.at(&Tok::Dedent) {
            Ok(())
        } else {
            Err(self.error("expected the end of the line here"))
        }
    }
    fn enter(&mut self) -> Result<(), SourceError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH { Err(self.error("nesting is too deep")) } else { Ok(()) }
    }

    fn block(&mut self) -> Result<Vec<Stmt>, SourceError> {
        self.expect_op(":")?;
        if !self.eat(&Tok::Newline) {
            // A one-line body: `if c: x = y`.
            return Ok(vec![self.simple_statement()?]);
        }
        if !self.eat(&Tok::Indent) {
            return Err(self.error("expected an indented block here"));
        }
        self.enter()?;
        let mut body = Vec::new();
        while !self.eat(&Tok::Dedent) {
            if self.at(&Tok::Eof) {
                break;
            }
            if self.eat(&Tok::Newline) {
                continue;
            }
            body.push(self.statement()?);
        }
        self.depth -= 1;
        Ok(body)
    }

    fn statement(&mut self) -> Result<Stmt, SourceError> {
        let start = self.peek().span;
        if self.at_op("@") {
            let mut decorators = Vec::new();
            while self.eat_op("@") {
                decorators.push(self.expr()?);
                self.expect_newline()?;
            }
            if self.at_name("def") {
                let mut f = self.function()?;
                f.decorators = decorators;
                return Ok(Stmt::Function(f));
            }
            if self.at_name("class") {
                return self.class(decorators, start);
            }
            return Err(self.error("expected `def` or `class` after decorators"));
        }
        if self.at_name("def") {
            return Ok(Stmt::Function(self.function()?));
        }
        if self.at_name("class") {
            return self.class(Vec::new(), start);
        }
        if self.at_name("if") {
            self.bump();
            let cond = self.expr()?;
            let then = self.block()?;
            let otherwise = if self.at_name("else") {
                self.bump();
                self.block()?
            } else if self.at_name("elif") {
                return Err(self.error("`elif` is outside the subset: nest an `if` in the `else` block"));
            } else {
                Vec::new()
            };
            return Ok(Stmt::If { cond, then, otherwise, span: start.to(self.prev_span()) });
        }
        if self.at_name("with") {
            self.bump();
            let context = self.expr()?;
            let body = self.block()?;
            return Ok(Stmt::With { context, body, span: start.to(self.prev_span()) });
        }
        let s = self.simple_statement()?;
        Ok(s)
    }

    fn prev_span(&self) -> Span {
        self.tokens[self.pos.saturating_sub(1)].span
    }

    fn simple_statement(&mut self) -> Result<Stmt, SourceError> {
        let start = self.peek().span;
        if self.at_name("import") || self.at_name("from") {
            while !self.at(&Tok::Newline) && !self.at(&Tok::Eof) {
                self.bump();
            }
            self.expect_newline()?;
            return Ok(Stmt::Skipped(start.to(self.prev_span())));
        }
        if self.at_name("pass") {
            self.bump();
            self.expect_newline()?;
            return Ok(Stmt::Skipped(start));
        }
        if self.at_name("return") {
            self.bump();
            let value = if self.at(&Tok::Newline) || self.at(&Tok::Eof) { None } else { Some(self.expr_list()?) };
            self.expect_newline()?;
            return Ok(Stmt::Return(value, start.to(self.prev_span())));
        }
        // `name: ann = value`, `a, b = value`, `name = value`, or an expression.
        if let (Tok::Name(_), Tok::Op(":")) = (&self.peek().tok, self.peek_at(1)) {
            let (name, nspan) = self.expect_name()?;
            self.bump();
            let annotation = self.expr()?;
            self.expect_op("=")?;
            let value = self.expr_list()?;
            self.expect_newline()?;
            let span = start.to(self.prev_span());
            return Ok(Stmt::Assign { targets: vec![(name, nspan)], annotation: Some(annotation), value, span });
        }
        let first = self.expr_list()?;
        if self.eat_op("=") {
            let targets = match &first {
                Expr::Name(n, s) => vec![(n.clone(), *s)],
                Expr::Tuple(items, _) => items
                    .iter()
                    .map(|e| match e {
                        Expr::Name(n, s) => Ok((n.clone(), *s)),
                        other => Err(SourceError::new(other.span(), "only names can be assigned to")),
                    })
                    .collect::<Result<_, _>>()?,
                other => return Err(SourceError::new(other.span(), "only names can be assigned to")),
            };
            let value = self.expr_list()?;
            self.expect_newline()?;
            return Ok(Stmt::Assign { targets, annotation: None, value, span: start.to(self.prev_span()) });
        }
        self.expect_newline()?;
        Ok(Stmt::Expr(first))
    }

    fn function(&mut self) -> Result<FunctionDef, SourceError> {
        let start = self.bump().span; // def
        let (name, name_span) = self.expect_name()?;
        self.expect_op("(")?;
        let mut params = Vec::new();
        while !self.at_op(")") {
            let (pname, pspan) = self.expect_name()?;
            let annotation = if self.eat_op(":") { Some(self.expr()?) } else { None };
            params.push(Param { name: pname, annotation, span: pspan });
            if !self.eat_op(",") {
                break;
            }
        }
        self.expect_op(")")?;
        let ret = if self.eat_op("->") { Some(self.expr()?) } else { None };
        let body = self.block()?;
        Ok(FunctionDef { decorators: Vec::new(), name, name_span, params, ret, body, span: start.to(self.prev_span()) })
    }

    fn class(&mut self, decorators: Vec<Expr>, start: Span) -> Result<Stmt, SourceError> {
        self.bump(); // class
        let (name, _) = self.expect_name()?;
        if self.eat_op("(") {
            while !self.at_op(")") && !self.at(&Tok::Eof) {
                self.bump();
            }
            self.expect_op(")")?;
        }
        let body = self.block()?;
        Ok(Stmt::Class { decorators, name, body, span: start.to(self.prev_span()) })
    }

    /// Expressions separated by commas: a tuple when there is a comma.
    fn expr_list(&mut self) -> Result<Expr, SourceError> {
        let first = self.expr()?;
        if !self.at_op(",") {
            return Ok(first);
        }
        let start = first.span();
        let mut items = vec![first];
        while self.eat_op(",") {
            if self.at(&Tok::Newline) || self.at_op("=") || self.at_op(")") {
                break;
            }
            items.push(self.expr()?);
        }
        Ok(Expr::Tuple(items, start.to(self.prev_span())))
    }

    fn expr(&mut self) -> Result<Expr, SourceError> {
        self.enter()?;
        let e = self.additive();
        self.depth -= 1;
        e
    }

    fn additive(&mut self) -> Result<Expr, SourceError> {
        let mut lhs = self.multiplicative()?;
        while self.at_op("+") || self.at_op("-") {
            let op = if self.bump().tok == Tok::Op("+") { "+" } else { "-" };
            let rhs = self.multiplicative()?;
            let span = lhs.span().to(rhs.span());
            lhs = Expr::BinOp { op, lhs: Box::new(lhs), rhs: Box::new(rhs), span };
        }
        Ok(lhs)
    }

    fn multiplicative(&mut self) -> Result<Expr, SourceError> {
        let mut lhs = self.unary()?;
        while let Tok::Op(op @ ("*" | "//" | "%" | "/")) = self.peek().tok {
            self.bump();
            let rhs = self.unary()?;
            let span = lhs.span().to(rhs.span());
            lhs = Expr::BinOp { op, lhs: Box::new(lhs), rhs: Box::new(rhs), span };
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, SourceError> {
        if self.at_op("-") {
            let start = self.bump().span;
            self.enter()?;
            let inner = self.unary()?;
            self.depth -= 1;
            let span = start.to(inner.span());
            return Ok(match inner {
                Expr::Int(v, _) => Expr::Int(v.wrapping_neg(), span),
                Expr::Float(v, _) => Expr::Float(-v, span),
                other => Expr::Neg(Box::new(other), span),
            });
        }
        self.postfix()
    }

    fn postfix(&mut self) -> Result<Expr, SourceError> {
        let mut e = self.atom()?;
        loop {
            if self.eat_op(".") {
                let (attr, s) = self.expect_name()?;
                let span = e.span().to(s);
                e = Expr::Attr(Box::new(e), attr, span);
            } else if self.at_op("(") {
                self.bump();
                let (args, kwargs) = self.call_args()?;
                let end = self.expect_op(")")?;
                let span = e.span().to(end);
                e = Expr::Call { func: Box::new(e), args, kwargs, span };
            } else if self.at_op("[") {
                self.bump();
                let index = self.expr_list()?;
                let end = self.expect_op("]")?;
                let span = e.span().to(end);
                e = Expr::Subscript { value: Box::new(e), index: Box::new(index), span };
            } else {
                return Ok(e);
            }
        }
    }

    fn call_args(&mut self) -> Result<(Vec<Expr>, Keywords), SourceError> {
        let (mut args, mut kwargs) = (Vec::new(), Vec::new());
        while !self.at_op(")") {
            if let (Tok::Name(n), Tok::Op("=")) = (&self.peek().tok, self.peek_at(1)) {
                let n = n.clone();
                self.bump();
                self.bump();
                kwargs.push((n, self.expr()?));
            } else if !kwargs.is_empty() {
                return Err(self.error("positional argument after a keyword argument"));
            } else {
                args.push(self.expr()?);
            }
            if !self.eat_op(",") {
                break;
            }
        }
        Ok((args, kwargs))
    }

    fn atom(&mut self) -> Result<Expr, SourceError> {
        let t = self.bump();
        Ok(match t.tok {
            Tok::Int(v) => Expr::Int(v, t.span),
            Tok::Float(v) => Expr::Float(v, t.span),
            Tok::Str(s) => Expr::Str(s, t.span),
            Tok::Name(n) => match n.as_str() {
                "True" => Expr::Bool(true, t.span),
                "False" => Expr::Bool(false, t.span),
                "None" => Expr::None(t.span),
                _ => Expr::Name(n, t.span),
            },
            Tok::Op("(") => {
                if self.at_op(")") {
                    let end = self.bump().span;
                    return Ok(Expr::Tuple(Vec::new(), t.span.to(end)));
                }
                self.enter()?;
                let first = self.expr()?;
                let e = if self.at_op(",") {
                    let mut items = vec![first];
                    while self.eat_op(",") {
                        if self.at_op(")") {
                            break;
                        }
                        items.push(self.expr()?);
                    }
                    let end = self.expect_op(")")?;
                    Expr::Tuple(items, t.span.to(end))
                } else {
                    self.expect_op(")")?;
                    first
                };
                self.depth -= 1;
                e
            }
            Tok::Op("[") => {
                self.enter()?;
                let mut items = Vec::new();
                while !self.at_op("]") {
                    items.push(self.expr()?);
                    if !self.eat_op(",") {
                        break;
                    }
                }
                let end = self.expect_op("]")?;
                self.depth -= 1;
                Expr::List(items, t.span.to(end))
            }
            _ => return Err(SourceError::new(t.span, "expected an expression here")),
        })
    }
}
