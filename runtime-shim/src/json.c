/*
 * json.c: a small JSON reader for the weight indexes a model reads at run time (TVM's
 * tensor-cache.json, a safetensors header).
 *
 * The text is untrusted: nesting is bounded, every index and length is checked, and the tree is
 * one allocation of nodes plus one of decoded strings, both sized from the text's length before
 * parsing (a JSON text of n bytes has fewer than n + 1 values), so a hostile file cannot make it
 * allocate more than a few times its own size.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { MAX_DEPTH = 64 };

typedef struct parser {
  const char *text;
  size_t len, pos;
  rvm_json *nodes;
  size_t used, cap;
  char *strings; /* decoded strings, NUL-terminated */
  size_t strings_used;
  const char *error;
} parser;

static void skip_space(parser *p) {
  while (p->pos < p->len && (p->text[p->pos] == ' ' || p->text[p->pos] == '\t' || p->text[p->pos] == '\n' || p->text[p->pos] == '\r'))
    p->pos++;
}

static rvm_json *new_node(parser *p, int kind) {
  if (p->used == p->cap) {
    p->error = "too many values";
    return NULL;
  }
  rvm_json *n = &p->nodes[p->used++];
  memset(n, 0, sizeof *n);
  n->kind = kind;
  return n;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* A string at p->pos (after its opening quote); decoded into p->strings. */
static const char *parse_string(parser *p, size_t *out_len) {
  char *out = p->strings + p->strings_used, *w = out;
  while (p->pos < p->len) {
    char c = p->text[p->pos++];
    if (c == '"') {
      *w = 0;
      *out_len = (size_t)(w - out);
      p->strings_used += *out_len + 1;
      return out;
    }
    if ((unsigned char)c < 0x20) break;
    if (c != '\\') {
      *w++ = c;
      continue;
    }
    if (p->pos >= p->len) break;
    c = p->text[p->pos++];
    switch (c) {
      case '"': case '\\': case '/': *w++ = c; break;
      case 'b': *w++ = '\b'; break;
      case 'f': *w++ = '\f'; break;
      case 'n': *w++ = '\n'; break;
      case 'r': *w++ = '\r'; break;
      case 't': *w++ = '\t'; break;
      case 'u': {
        /* Names of weights are ASCII; a \u escape is kept only when it is one byte. */
        if (p->len - p->pos < 4) goto bad;
        int v = 0;
        for (int k = 0; k < 4; k++) {
          int d = hex_digit(p->text[p->pos++]);
          if (d < 0) goto bad;
          v = v * 16 + d;
        }
        *w++ = v > 0 && v < 0x80 ? (char)v : '?';
        break;
      }
      default: goto bad;
    }
  }
bad:
  p->error = "a string is malformed or unterminated";
  return NULL;
}

static rvm_json *parse_value(parser *p, int depth);

static rvm_json *parse_container(parser *p, int depth, bool object) {
  rvm_json *n = new_node(p, object ? RVM_JSON_OBJECT : RVM_JSON_ARRAY);
  if (!n) return NULL;
  char close = object ? '}' : ']';
  rvm_json *last = NULL;
  skip_space(p);
  if (p->pos < p->len && p->text[p->pos] == close) {
    p->pos++;
    return n;
  }
  for (;;) {
    const char *key = NULL;
    size_t key_len = 0;
    if (object) {
      skip_space(p);
      if (p->pos >= p->len || p->text[p->pos] != '"') {
        p->error = "an object key is not a string";
        return NULL;
      }
      p->pos++;
      if (!(key = parse_string(p, &key_len))) return NULL;
      skip_space(p);
      if (p->pos >= p->len || p->text[p->pos] != ':') {
        p->error = "a ':' is missing after an object key";
        return NULL;
      }
      p->pos++;
    }
    rvm_json *item = parse_value(p, depth + 1);
    if (!item) return NULL;
    item->key = key;
    if (last) last->next = item;
    else n->first = item;
    last = item;
    n->count++;
    skip_space(p);
    if (p->pos < p->len && p->text[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->len && p->text[p->pos] == close) {
      p->pos++;
      return n;
    }
    p->error = object ? "an object is not closed" : "an array is not closed";
    return NULL;
  }
}

static rvm_json *parse_value(parser *p, int depth) {
  if (depth > MAX_DEPTH) {
    p->error = "nesting is too deep";
    return NULL;
  }
  skip_space(p);
  if (p->pos >= p->len) {
    p->error = "the text ends where a value should be";
    return NULL;
  }
  char c = p->text[p->pos];
  if (c == '{' || c == '[') {
    p->pos++;
    return parse_container(p, depth, c == '{');
  }
  if (c == '"') {
    p->pos++;
    rvm_json *n = new_node(p, RVM_JSON_STRING);
    if (!n || !(n->string = parse_string(p, &n->length))) return NULL;
    return n;
  }
  static const struct { const char *word; int kind; int64_t value; } words[] = {
      {"true", RVM_JSON_BOOL, 1}, {"false", RVM_JSON_BOOL, 0}, {"null", RVM_JSON_NULL, 0}};
  for (size_t k = 0; k < sizeof words / sizeof words[0]; k++) {
    size_t wl = strlen(words[k].word);
    if (p->len - p->pos >= wl && memcmp(p->text + p->pos, words[k].word, wl) == 0) {
      p->pos += wl;
      rvm_json *n = new_node(p, words[k].kind);
      if (n) n->integer = words[k].value;
      return n;
    }
  }
  /* Numbers: integers are what the indexes hold; others are kept as not-an-integer. */
  size_t start = p->pos;
  bool integer = true, negative = false;
  uint64_t value = 0;
  if (p->text[p->pos] == '-') {
    negative = true;
    p->pos++;
  }
  size_t digits = 0;
  while (p->pos < p->len) {
    char d = p->text[p->pos];
    if (d >= '0' && d <= '9') {
      if (value > (UINT64_MAX - 9) / 10) integer = false;
      value = value * 10 + (uint64_t)(d - '0');
      digits++;
    } else if (d == '.' || d == 'e' || d == 'E' || d == '+' || (d == '-' && p->pos > start + 1)) {
      integer = false;
    } else {
      break;
    }
    p->pos++;
  }
  if (digits == 0) {
    p->error = "a value is not JSON";
    return NULL;
  }
  rvm_json *n = new_node(p, RVM_JSON_NUMBER);
  if (!n) return NULL;
  if (integer && value <= (uint64_t)INT64_MAX) {
    n->is_integer = true;
    n->integer = negative ? -(int64_t)value : (int64_t)value;
  }
  return n;
}

int rvm_json_parse(const char *text, size_t len, const char *what, rvm_json_doc *out) {
  memset(out, 0, sizeof *out);
  if (len > ((size_t)1 << 30))
    return rvm_raise("ValueError", "%s: the JSON text is %zu bytes, more than an index can be", what, len);
  parser p = {.text = text, .len = len, .cap = len + 1};
  p.nodes = rvm_mem_calloc(p.cap, sizeof(rvm_json), "a JSON tree");
  p.strings = rvm_mem_alloc(len + 1, "JSON strings");
  if (!p.nodes || !p.strings) {
    rvm_mem_free(p.nodes);
    rvm_mem_free(p.strings);
    return -1;
  }
  rvm_json *root = parse_value(&p, 0);
  if (root) {
    skip_space(&p);
    if (p.pos != p.len) {
      root = NULL;
      p.error = "text follows the value";
    }
  }
  if (!root) {
    rvm_mem_free(p.nodes);
    rvm_mem_free(p.strings);
    return rvm_raise("ValueError", "%s is not valid JSON: %s (at byte %zu)", what, p.error ? p.error : "malformed", p.pos);
  }
  out->root = root;
  out->nodes = p.nodes;
  out->strings = p.strings;
  return 0;
}

void rvm_json_free(rvm_json_doc *doc) {
  rvm_mem_free(doc->nodes);
  rvm_mem_free(doc->strings);
  memset(doc, 0, sizeof *doc);
}

const rvm_json *rvm_json_get(const rvm_json *object, const char *key) {
  if (!object || object->kind != RVM_JSON_OBJECT) return NULL;
  for (const rvm_json *n = object->first; n; n = n->next)
    if (strcmp(n->key, key) == 0) return n;
  return NULL;
}

bool rvm_json_int(const rvm_json *n, int64_t *out) {
  if (!n || n->kind != RVM_JSON_NUMBER || !n->is_integer) return false;
  *out = n->integer;
  return true;
}
