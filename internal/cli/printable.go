package cli

import (
	"bytes"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable is s made safe to print to a terminal: every control character
// (C0 but not newline's use by the CLI itself, DEL, C1), every bidirectional
// override or isolate (which reorder what follows them on screen) and every
// byte that is not UTF-8 is shown as an escape (\x1b, \u202e). Text that a
// peer, an upstream or another user controls (error messages, node, GPU,
// reservation and task names, an upstream's last error) goes through it
// before the CLI prints it: an upstream answering "\x1b]0;PWNED\x07" must
// not retitle or clear the reader's terminal.
func Printable(s string) string {
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f {
		i++
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unprintable(r) && r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unprintable(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// unprintable: control characters and the bidirectional formatting
// characters that can make a terminal show text other than what it holds.
func unprintable(r rune) bool {
	return unicode.IsControl(r) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f || r == 0x061c
}

// printableJSON is JSON made safe to print as Printable makes text: the
// characters encoding/json leaves as they are (DEL, C1, bidirectional
// formatting) are escaped as \uXXXX, which stays valid JSON, since in valid
// JSON they can only be inside strings. Bytes that are not UTF-8 become
// U+FFFD.
func printableJSON(b []byte) []byte {
	if !bytes.ContainsFunc(b, func(r rune) bool { return r == utf8.RuneError || (r >= 0x7f && unprintable(r)) }) {
		return b
	}
	var out bytes.Buffer
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && size == 1:
			out.WriteString(`\ufffd`)
		case r >= 0x7f && unprintable(r):
			fmt.Fprintf(&out, `\u%04x`, r)
		default:
			out.Write(b[:size])
		}
		b = b[size:]
	}
	return out.Bytes()
}
