package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
	"go.yaml.in/yaml/v3"
)

// Parse checks a config file's bytes and returns the file as written. The
// error, an *Error, is the first problem found, with its line and key.
func Parse(data []byte) (*File, error) {
	if len(data) > MaxFileSize {
		return nil, &Error{Msg: fmt.Sprintf("larger than %d bytes (1 MiB), the most a config file may hold", MaxFileSize)}
	}
	if err := checkText(data); err != nil {
		return nil, err
	}
	root, err := decodeOne(data)
	if err != nil {
		return nil, err
	}
	return parseRoot(root)
}

// checkText refuses what the YAML library would refuse without saying on
// which line: bytes that are not UTF-8 and characters YAML does not allow. It
// also refuses line breaks other than \n and \r\n, so that every line number,
// the library's and this package's, counts the same lines an editor shows.
func checkText(data []byte) error {
	line := 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return &Error{Line: line, Msg: "not UTF-8 text: write the file in UTF-8"}
		case r == '\n':
			line++
		case r == '\r' && (i+1 == len(data) || data[i+1] != '\n'):
			return &Error{Line: line, Msg: `a carriage return (\r) that does not end a line: end lines with \n or \r\n`}
		case r == 0x85 || r == 0x2028 || r == 0x2029:
			return &Error{Line: line, Msg: fmt.Sprintf(`character %U: end lines with \n or \r\n`, r)}
		case !yamlPrintable(r):
			return &Error{Line: line, Msg: fmt.Sprintf("control character %U: not allowed in YAML", r)}
		}
		i += size
	}
	return nil
}

// yamlPrintable is the YAML 1.2 character set (c-printable).
func yamlPrintable(r rune) bool {
	return r == '\t' || r == '\n' || r == '\r' || r >= 0x20 && r <= 0x7e || r == 0x85 ||
		r >= 0xa0 && r <= 0xd7ff || r >= 0xe000 && r <= 0xfffd || r >= 0x10000 && r <= 0x10ffff
}

// decodeOne decodes the file's one YAML document and returns its root node.
// A second document, even an empty one, is refused: a file cut and pasted
// together should not have half of it ignored.
func decodeOne(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, emptyError()
		}
		return nil, syntaxError(err, data)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		return nil, &Error{Line: next.Line, Msg: "a second YAML document (after ---): a config file holds one"}
	case !errors.Is(err, io.EOF):
		return nil, syntaxError(err, data)
	}
	if len(doc.Content) != 1 || isNull(doc.Content[0]) {
		return nil, emptyError()
	}
	return doc.Content[0], nil
}

func parseRoot(root *yaml.Node) (*File, error) {
	f := &File{Weights: placement.DefaultWeights}
	err := eachPair(root, "", "a mapping with pools, quotas, profiles or score", func(key string, k, v *yaml.Node) error {
		if isNull(v) {
			// A section whose entries are all commented out is as if absent.
			return nil
		}
		switch key {
		case "pools":
			return f.parsePools(v)
		case "quotas":
			return f.parseQuotas(v)
		case "profiles":
			return f.parseProfiles(v)
		case "score":
			return f.parseScore(v)
		case "reservations":
			return f.parseReservations(v)
		}
		return errorAt(k, "", "unknown key %s (a config file has pools, quotas, profiles, score and reservations)", brief(key))
	})
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (f *File) parsePools(n *yaml.Node) error {
	return eachPair(n, "pools", "a mapping of pool names to pools", func(name string, k, v *yaml.Node) error {
		if len(f.Pools) == MaxPools {
			return errorAt(k, "pools", "more than %d pools", MaxPools)
		}
		if msg := checkPoolName(name); msg != "" {
			return errorAt(k, "pools", "pool name %s: %s", brief(name), msg)
		}
		p, err := parsePool(name, k, v)
		if err != nil {
			return err
		}
		f.Pools = append(f.Pools, p)
		return nil
	})
}

// checkPoolName says what is wrong with a pool name, or "". Names are kept
// plain so that they pass unquoted through command lines, URLs and logs.
func checkPoolName(name string) string {
	switch {
	case name == "":
		return "empty"
	case len(name) > MaxPoolName:
		return fmt.Sprintf("longer than %d bytes", MaxPoolName)
	case !isAlnum(rune(name[0])):
		return "must start with a letter or a digit"
	case strings.ContainsFunc(name, func(r rune) bool { return !isAlnum(r) && r != '.' && r != '_' && r != '-' }):
		return "may hold only letters, digits and . _ -"
	}
	return ""
}

func isAlnum(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

func parsePool(name string, k, v *yaml.Node) (PoolSpec, error) {
	path := join("pools", name)
	p := PoolSpec{Name: name, Line: k.Line, Everyone: true}
	if isNull(v) {
		return p, errorAt(k, path, "empty: a pool needs gpus")
	}
	err := eachPair(v, path, "a pool (gpus, users)", func(key string, kk, vv *yaml.Node) error {
		switch key {
		case "gpus":
			return p.parseGPUs(join(path, key), kk, vv)
		case "users":
			p.Everyone = false
			return p.parseUsers(join(path, key), kk, vv)
		}
		return errorAt(kk, path, "unknown key %s (a pool has gpus and users)", brief(key))
	})
	if err == nil && len(p.GPUs) == 0 {
		err = errorAt(k, path, "no gpus: a pool needs at least one GPU")
	}
	return p, err
}

func (p *PoolSpec) parseGPUs(path string, k, v *yaml.Node) error {
	if isNull(v) || v.Kind == yaml.SequenceNode && len(v.Content) == 0 {
		return errorAt(k, path, "empty: a pool needs at least one GPU")
	}
	if v.Kind == yaml.SequenceNode && len(v.Content) > MaxPoolGPUs {
		return errorAt(k, path, "more than %d GPUs", MaxPoolGPUs)
	}
	seen := map[string]int{}
	return eachItem(v, path, "GPU indices or UUIDs", func(i int, text string, item *yaml.Node) error {
		g, msg := parseGPU(text)
		if msg != "" {
			return errorAt(item, index(path, i), "%s", msg)
		}
		g.Line, g.path = item.Line, index(path, i)
		id := strings.ToLower(g.UUID)
		if id == "" {
			id = strconv.Itoa(g.Index)
		}
		if first, dup := seen[id]; dup {
			return errorAt(item, g.path, "GPU %s listed twice (first on line %d)", brief(text), first)
		}
		seen[id] = item.Line
		p.GPUs = append(p.GPUs, g)
		return nil
	})
}

// uuidMax is the longest UUID NVML reports (NVML_DEVICE_UUID_V2_BUFFER_SIZE
// less its terminating NUL).
const uuidMax = 95

// parseGPU reads a GPU entry: a decimal index, or a UUID "GPU-..." in any
// case, as a lease request's gpu field takes it.
func parseGPU(s string) (GPUSpec, string) {
	if s != "" && strings.Trim(s, "0123456789") == "" {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n > MaxGPUIndex {
			return GPUSpec{}, fmt.Sprintf("GPU index %s is out of range (0 to %d)", number(s), MaxGPUIndex)
		}
		return GPUSpec{Index: int(n)}, ""
	}
	if len(s) > len("GPU-") && strings.EqualFold(s[:len("GPU-")], "GPU-") {
		if len(s) > uuidMax || strings.ContainsFunc(s, func(r rune) bool { return !isAlnum(r) && r != '-' }) {
			return GPUSpec{}, fmt.Sprintf("%s is not a GPU UUID: GPU- and then at most %d letters, digits and -", brief(s), uuidMax-len("GPU-"))
		}
		return GPUSpec{UUID: s}, ""
	}
	return GPUSpec{}, fmt.Sprintf("%s is neither a GPU index (0, 1, ...) nor a GPU UUID (GPU-...)", brief(s))
}

func (p *PoolSpec) parseUsers(path string, k, v *yaml.Node) error {
	if isNull(v) {
		// Left empty, users would read as "everyone" to some and "nobody"
		// to others: make the writer say which.
		return errorAt(k, path, "empty: leave users out to open the pool to everyone, or write users: [] for admins only")
	}
	if v.Kind == yaml.SequenceNode && len(v.Content) > MaxPoolUsers {
		return errorAt(k, path, "more than %d users", MaxPoolUsers)
	}
	p.Users = []Principal{}
	seen := map[string]int{}
	return eachItem(v, path, "users and group:NAME", func(i int, text string, item *yaml.Node) error {
		who, msg := parsePrincipal(text)
		if msg == "" && who.Kind == identity.Everyone {
			msg = `"*" is for quotas: leave users out to open the pool to everyone`
		}
		if msg != "" {
			return errorAt(item, index(path, i), "%s", msg)
		}
		who.Line, who.path = item.Line, index(path, i)
		if first, dup := seen[who.String()]; dup {
			return errorAt(item, who.path, "%s listed twice (first on line %d)", brief(text), first)
		}
		seen[who.String()] = item.Line
		p.Users = append(p.Users, who)
		return nil
	})
}

// parsePrincipal reads "*", a user name, a uid, "group:NAME" or "group:GID",
// by identity's one rule; the message says what is wrong, or is "".
func parsePrincipal(s string) (Principal, string) {
	p, err := identity.Parse(s)
	if err != nil {
		return Principal{}, err.Error()
	}
	return Principal{Principal: p}, ""
}

func (f *File) parseQuotas(n *yaml.Node) error {
	return eachPair(n, "quotas", "a mapping of users, group:NAME or * to units", func(key string, k, v *yaml.Node) error {
		if len(f.Quotas) == MaxQuotas {
			return errorAt(k, "quotas", "more than %d quotas", MaxQuotas)
		}
		who, msg := parsePrincipal(key)
		if msg != "" {
			return errorAt(k, "quotas", "%s", msg)
		}
		path := join("quotas", key)
		who.Line, who.path = k.Line, path
		limit, err := parseUnits(v, path)
		if err != nil {
			return err
		}
		f.Quotas = append(f.Quotas, QuotaSpec{Who: who, Limit: limit})
		return nil
	})
}

// parseUnits reads a quota: a whole number of units from 0 to MaxQuota,
// written as a plain decimal number.
func parseUnits(v *yaml.Node, path string) (int, error) {
	const expected = "a whole number of units"
	text, err := scalar(v, path, expected)
	if err != nil {
		return 0, err
	}
	digits := strings.Trim(text, "0123456789") == ""
	switch tag := v.ShortTag(); {
	case tag != "!!int" && tag != "!!float":
		return 0, errorAt(v, path, "expected %s, found %s", expected, what(v))
	case strings.HasPrefix(text, "-"):
		return 0, errorAt(v, path, "%s is negative: a quota is 0 or more units", number(text))
	case !digits && tag == "!!float":
		return 0, errorAt(v, path, "%s is not a whole number of units", number(text))
	case !digits:
		return 0, errorAt(v, path, "%s: write the units as a decimal number", brief(text))
	}
	n, err := strconv.ParseUint(text, 10, 32)
	if err != nil || n > MaxQuota {
		return 0, errorAt(v, path, "%s units is more than %d, the most a quota may be", number(text), MaxQuota)
	}
	return int(n), nil
}

func (f *File) parseProfiles(n *yaml.Node) error {
	f.Profiles = map[string]map[string]time.Duration{}
	return eachPair(n, "profiles", "a mapping of task names to run times", func(task string, k, v *yaml.Node) error {
		if len(f.Profiles) == MaxTasks {
			return errorAt(k, "profiles", "more than %d tasks", MaxTasks)
		}
		if msg := checkText256(task); msg != "" {
			return errorAt(k, "profiles", "task name %s: %s", brief(task), msg)
		}
		path := join("profiles", task)
		if isNull(v) {
			return errorAt(k, path, "empty: give the task's run time per GPU model")
		}
		times := map[string]time.Duration{}
		err := eachPair(v, path, "a mapping of GPU model names to run times", func(model string, kk, vv *yaml.Node) error {
			if len(times) == MaxTaskModels {
				return errorAt(kk, path, "more than %d GPU models", MaxTaskModels)
			}
			if msg := checkText256(model); msg != "" {
				return errorAt(kk, path, "GPU model name %s: %s", brief(model), msg)
			}
			d, err := parseRunTime(vv, join(path, model))
			times[model] = d
			return err
		})
		f.Profiles[task] = times
		return err
	})
}

// checkText256 says what is wrong with a task or GPU model name, or "": the
// lease API takes task names of at most 256 bytes without control
// characters.
func checkText256(s string) string {
	switch {
	case s == "":
		return "empty"
	case len(s) > MaxName:
		return fmt.Sprintf("longer than %d bytes", MaxName)
	case strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "holds a control character"
	}
	return ""
}

func parseRunTime(v *yaml.Node, path string) (time.Duration, error) {
	text, err := scalar(v, path, "a run time such as 95s or 6m50s")
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(text)
	switch {
	case err != nil && strings.Trim(text, "0123456789.") == "":
		return 0, errorAt(v, path, "%s has no unit: write a run time such as 95s or 6m50s", brief(text))
	case err != nil:
		return 0, errorAt(v, path, "%s is not a run time such as 95s or 6m50s", brief(text))
	case d <= 0:
		return 0, errorAt(v, path, "run time %s: must be more than 0", brief(text))
	}
	return d, nil
}

func (f *File) parseScore(n *yaml.Node) error {
	var w placement.Weights
	err := eachPair(n, "score", "a mapping of weights (cc, bandwidth, clock)", func(key string, k, v *yaml.Node) error {
		var dst *float64
		switch key {
		case "cc":
			dst = &w.CC
		case "bandwidth":
			dst = &w.Bandwidth
		case "clock":
			dst = &w.Clock
		default:
			return errorAt(k, "score", "unknown key %s (score has cc, bandwidth and clock)", brief(key))
		}
		var err error
		*dst, err = parseWeight(v, join("score", key))
		return err
	})
	if err != nil {
		return err
	}
	if w == (placement.Weights{}) {
		return errorAt(n, "score", "every weight is 0: give one above 0, or leave score out to weigh each 1/3")
	}
	f.Weights = w
	return nil
}

func parseWeight(v *yaml.Node, path string) (float64, error) {
	expected := fmt.Sprintf("a weight from 0 to %d", MaxWeight)
	text, err := scalar(v, path, expected)
	if err != nil {
		return 0, err
	}
	if tag := v.ShortTag(); tag != "!!int" && tag != "!!float" {
		return 0, errorAt(v, path, "expected %s, found %s", expected, what(v))
	}
	w, err := strconv.ParseFloat(text, 64)
	if err != nil || math.IsNaN(w) || w < 0 || w > MaxWeight {
		return 0, errorAt(v, path, "%s is not %s", number(text), expected)
	}
	return w, nil
}
