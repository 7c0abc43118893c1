package config

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/gpulet/gpulet/identity"
	"go.yaml.in/yaml/v3"
)

// Reading YAML nodes: errors that name their line and key, and the walks of
// mappings and sequences every section uses.

func emptyError() error {
	return &Error{Msg: "empty: write {} for a config with no pools, quotas or profiles"}
}

// parserProblems are the messages of the YAML library's parser, as opposed
// to its scanner. The library counts the lines of the parser's errors from 0
// and those of the scanner's from 1, and leaves "line N" out for either on
// line 1; syntaxError makes them all count from 1.
var parserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"did not find expected node content":     true,
	"did not find expected key":              true,
	"did not find expected '-' indicator":    true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"found duplicate %YAML directive":        true,
	"found duplicate %TAG directive":         true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

// syntaxError turns an error of the YAML library into an *Error on the line
// the library means.
func syntaxError(err error, data []byte) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 1
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, tail, ok := strings.Cut(rest, ": "); ok {
			if v, err := strconv.Atoi(n); err == nil {
				line, msg = v, tail
				if parserProblems[msg] {
					line++
				}
			}
		}
	} else if name, ok := unknownAnchor(msg); ok {
		line = aliasLine(data, name)
	}
	// The library may point just past the end; the last line is closer.
	line = min(max(line, 1), bytes.Count(data, []byte("\n"))+1)
	if tabProblems[msg] {
		if l := tabLine(data, line); l > 0 {
			return &Error{Line: l, Msg: "a tab in the indentation: YAML indents with spaces only"}
		}
	}
	return &Error{Line: line, Msg: "YAML: " + msg}
}

// unknownAnchor returns the name in the library's "unknown anchor 'NAME'
// referenced", an error that carries no line.
func unknownAnchor(msg string) (string, bool) {
	rest, ok := strings.CutPrefix(msg, "unknown anchor '")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "' referenced")
}

// aliasLine is the first line with the alias *name, or 1. It can be fooled by
// the same text in a comment or a quoted string before the alias.
func aliasLine(data []byte, name string) int {
	for i, l := range bytes.Split(data, []byte("\n")) {
		for rest := l; ; {
			at := bytes.Index(rest, []byte("*"+name))
			if at < 0 {
				break
			}
			rest = rest[at+1+len(name):]
			if len(rest) == 0 || strings.IndexByte(" \t\r,[]{}", rest[0]) >= 0 {
				return i + 1
			}
		}
	}
	return 1
}

// join names a key under path: pools.training, quotas."group:ml".
func join(path, key string) string {
	if key == "" || strings.ContainsFunc(key, func(r rune) bool { return !isAlnum(r) && r != '_' && r != '-' }) {
		key = strconv.Quote(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// errorAt is a problem with node n, found under path.
func errorAt(n *yaml.Node, path, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	return &Error{Line: n.Line, Msg: msg}
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// what describes a node for "expected ..., found WHAT".
func what(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	switch n.ShortTag() {
	case "!!null":
		return "nothing"
	case "!!str":
		return "the text " + brief(n.Value)
	case "!!int", "!!float":
		return "the number " + brief(n.Value)
	case "!!bool":
		return "the boolean " + n.Value
	}
	tag := n.ShortTag()
	if strings.ContainsFunc(tag, unicode.IsControl) {
		// A tag may hold anything, %-escaped.
		tag = brief(tag)
	}
	return brief(n.Value) + " tagged " + tag
}

// brief quotes s, cut short so that an error stays one readable line.
func brief(s string) string { return identity.Quote(s) }

// number shows a value that reads as a number as it is written, anything
// else (a tag can make any text a number) quoted and cut short by brief.
func number(s string) string {
	if s != "" && len(s) <= 32 && strings.Trim(s, "0123456789.+-eE") == "" {
		return s
	}
	return brief(s)
}

// scalar returns the text of a scalar node: a key or a value written as
// text, a number, a boolean or a date is taken as written. An alias, a
// collection, nothing (null) and a value with another tag are refused, naming
// what was expected.
func scalar(n *yaml.Node, path, expected string) (string, error) {
	if n.Kind == yaml.AliasNode {
		return "", errorAt(n, path, "an alias (*%s): aliases are not supported, write the value out", n.Value)
	}
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!str", "!!int", "!!float", "!!bool", "!!timestamp":
			return n.Value, nil
		case "!!merge":
			return "", errorAt(n, path, "a merge key (<<): merge keys are not supported")
		}
	}
	return "", errorAt(n, path, "expected %s, found %s", expected, what(n))
}

// eachPair checks that n is a mapping of distinct keys and calls fn with each
// key and value, in the file's order.
func eachPair(n *yaml.Node, path, expected string, fn func(key string, k, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		if n.Kind == yaml.AliasNode {
			_, err := scalar(n, path, expected)
			return err
		}
		return errorAt(n, path, "expected %s, found %s", expected, what(n))
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key, err := scalar(k, path, "a key")
		if err != nil {
			return err
		}
		if first, dup := seen[key]; dup {
			return errorAt(k, path, "key %s given twice (first on line %d)", brief(key), first)
		}
		seen[key] = k.Line
		if v.Kind == yaml.AliasNode {
			_, err := scalar(v, join(path, key), "")
			return err
		}
		if err := fn(key, k, v); err != nil {
			return err
		}
	}
	return nil
}

// eachItem checks that n is a list of scalars and calls fn with each one's
// text, in order.
func eachItem(n *yaml.Node, path, expected string, fn func(i int, text string, item *yaml.Node) error) error {
	if n.Kind != yaml.SequenceNode {
		if n.Kind == yaml.AliasNode {
			_, err := scalar(n, path, "")
			return err
		}
		return errorAt(n, path, "expected a list of %s, found %s", expected, what(n))
	}
	for i, item := range n.Content {
		text, err := scalar(item, index(path, i), expected)
		if err != nil {
			return err
		}
		if err := fn(i, text, item); err != nil {
			return err
		}
	}
	return nil
}

// tabProblems are the library's words for a tab where YAML wants spaces,
// which name neither the tab nor where it is.
var tabProblems = map[string]bool{
	"found character that cannot start any token":     true,
	"found a tab character that violates indentation": true,
}

// tabLine is the line, from 1, with a tab among its leading blanks: the
// line the library named if it is one, else the next (the library may name
// the line before), else the nearest before it; 0 if none is.
func tabLine(data []byte, near int) int {
	lines := bytes.Split(data, []byte("\n"))
	tabbed := func(l int) bool {
		if l < 1 || l > len(lines) {
			return false
		}
		line := lines[l-1]
		indent := line[:len(line)-len(bytes.TrimLeft(line, " \t"))]
		return bytes.IndexByte(indent, '\t') >= 0
	}
	for _, l := range []int{near, near + 1} {
		if tabbed(l) {
			return l
		}
	}
	for l := near - 1; l >= 1; l-- {
		if tabbed(l) {
			return l
		}
	}
	return 0
}
