package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
)

// designExample is the config example of docs/design.md §11, as it stands there.
const designExample = `pools:                      # named GPU groups; a GPU may sit in several
  training:
    gpus: ["0", "1"]        # indices or UUIDs
    users: ["alice", "group:ml"]   # who may lease here; absent: everyone
  inference:
    gpus: ["2"]
quotas:                     # most units one user (or group, or everyone: "*") may hold at once
  alice: 8
  "group:ml": 24
  "*": 64
profiles:                   # task–engine affinity: a task's measured run time per GPU model
  resnet50:
    "NVIDIA A100-SXM4-80GB": 95s
    "Tesla T4": 410s
`

func TestParseDesignExample(t *testing.T) {
	f, err := Parse([]byte(designExample))
	if err != nil {
		t.Fatal(err)
	}
	want := &File{
		Pools: []PoolSpec{
			{Name: "training", Line: 2, GPUs: []GPUSpec{
				{Index: 0, Line: 3, path: "pools.training.gpus[0]"},
				{Index: 1, Line: 3, path: "pools.training.gpus[1]"},
			}, Users: []Principal{
				{Principal: identity.Principal{Kind: identity.User, Name: "alice"}, Line: 4, path: "pools.training.users[0]"},
				{Principal: identity.Principal{Kind: identity.Group, Name: "ml"}, Line: 4, path: "pools.training.users[1]"},
			}},
			{Name: "inference", Line: 5, Everyone: true, GPUs: []GPUSpec{{Index: 2, Line: 6, path: "pools.inference.gpus[0]"}}},
		},
		Quotas: []QuotaSpec{
			{Who: Principal{Principal: identity.Principal{Kind: identity.User, Name: "alice"}, Line: 8, path: "quotas.alice"}, Limit: 8},
			{Who: Principal{Principal: identity.Principal{Kind: identity.Group, Name: "ml"}, Line: 9, path: `quotas."group:ml"`}, Limit: 24},
			{Who: Principal{Principal: identity.Principal{Kind: identity.Everyone}, Line: 10, path: `quotas."*"`}, Limit: 64},
		},
		Profiles: map[string]map[string]time.Duration{"resnet50": {"NVIDIA A100-SXM4-80GB": 95 * time.Second, "Tesla T4": 410 * time.Second}},
		Weights:  placement.DefaultWeights,
	}
	if !reflect.DeepEqual(f, want) {
		t.Fatalf("got  %+v\nwant %+v", f, want)
	}
}

func TestParseForms(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		check    func(*File) bool
	}{
		{"no rules", "{}", func(f *File) bool {
			return len(f.Pools)+len(f.Quotas)+len(f.Profiles) == 0 && f.Weights == placement.DefaultWeights
		}},
		{"sections left empty", "pools:\nquotas:\nprofiles:\nscore:\n", func(f *File) bool {
			return len(f.Pools)+len(f.Quotas)+len(f.Profiles) == 0 && f.Weights == placement.DefaultWeights
		}},
		{"explicit document start and end", "---\nquotas: {alice: 1}\n...\n", func(f *File) bool { return len(f.Quotas) == 1 }},
		{"CRLF line ends", "quotas:\r\n  alice: 3\r\n", func(f *File) bool { return f.Quotas[0].Limit == 3 && f.Quotas[0].Who.Line == 2 }},
		{"byte order mark", "\ufeffquotas: {alice: 3}\n", func(f *File) bool { return f.Quotas[0].Limit == 3 }},
		{"unquoted indices and UUIDs in any case", "pools:\n  p:\n    gpus: [0, 7, gpu-ab12-CD, GPU-ef]\n", func(f *File) bool {
			g := f.Pools[0].GPUs
			return g[0].Index == 0 && g[0].UUID == "" && g[1].Index == 7 && g[2].UUID == "gpu-ab12-CD" && g[3].UUID == "GPU-ef"
		}},
		{"admins only", "pools:\n  p:\n    gpus: [0]\n    users: []\n", func(f *File) bool { return !f.Pools[0].Everyone && len(f.Pools[0].Users) == 0 }},
		{"numeric uid and gid", "pools:\n  p:\n    gpus: [0]\n    users: [1001, 'group:2000', bob.smith, 'svc$', 'ann@corp']\n", func(f *File) bool {
			u := f.Pools[0].Users
			return u[0] == Principal{Principal: identity.Principal{Kind: identity.User, Name: "1001", ByID: true, ID: 1001}, Line: 4, path: "pools.p.users[0]"} &&
				u[1].Kind == identity.Group && u[1].ByID && u[1].ID == 2000 && u[2].Name == "bob.smith" && !u[2].ByID && len(u) == 5
		}},
		{"quota 0 bars a user", "quotas:\n  mallory: 0\n", func(f *File) bool { return f.Quotas[0].Limit == 0 }},
		{"pool names as the file orders them", "pools:\n  zeta: {gpus: [0]}\n  alpha: {gpus: [1]}\n", func(f *File) bool { return f.Pools[0].Name == "zeta" && f.Pools[1].Name == "alpha" }},
		{"a pool name that YAML reads as a number", "pools:\n  2024: {gpus: [0]}\n", func(f *File) bool { return f.Pools[0].Name == "2024" }},
		{"weights", "score: {cc: 0.5, bandwidth: 2}\n", func(f *File) bool { return f.Weights == placement.Weights{CC: 0.5, Bandwidth: 2} }},
		{"run times", "profiles:\n  t: {T4: 1m30s, A10: 1.5h, L4: 250ms}\n", func(f *File) bool {
			return reflect.DeepEqual(f.Profiles["t"], map[string]time.Duration{"T4": 90 * time.Second, "A10": 90 * time.Minute, "L4": 250 * time.Millisecond})
		}},
		{"anchors without aliases", "pools:\n  p: &x {gpus: [0]}\n", func(f *File) bool { return len(f.Pools) == 1 }},
		{"a pool with as many GPUs as allowed", "pools:\n  p:\n    gpus: [" + seq(MaxPoolGPUs, "") + "]\n", func(f *File) bool { return len(f.Pools[0].GPUs) == MaxPoolGPUs }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(f) {
				t.Fatalf("%+v", f)
			}
		})
	}
}

// seq lists prefix0, prefix1, ... prefix(n-1), comma-separated.
func seq(n int, prefix string) string {
	items := make([]string, n)
	for i := range items {
		items[i] = prefix + strconv.Itoa(i)
	}
	return strings.Join(items, ", ")
}

// poolHead is a pool on lines 1-3, for cases about its users.
const poolHead = "pools:\n  p:\n    gpus: [0]\n"

// parseErrorCases is one file per kind of error Parse finds; FuzzParse starts
// from them too.
var parseErrorCases = []struct {
	name, in string
	line     int
	want     string
}{
	// The file as a whole.
	{"empty", "", 0, "empty: write {} for a config with no pools, quotas or profiles"},
	{"comments only", "# nothing yet\n", 0, "empty"},
	{"null document", "---\n~\n", 0, "empty"},
	{"too large", "{}" + strings.Repeat(" ", MaxFileSize), 0, "larger than 1048576 bytes (1 MiB)"},

	// Text and YAML.
	{"not UTF-8", "quotas:\n  al\xffce: 1\n", 2, "not UTF-8 text"},
	{"UTF-16", "\xff\xfeq\x00", 1, "not UTF-8 text"},
	{"control character", "quotas:\n\n  a\x01: 1\n", 3, "control character U+0001"},
	{"NUL", "{}\x00", 1, "control character U+0000"},
	{"lone carriage return", "quotas:\r  a: 1\n", 1, `carriage return (\r)`},
	{"unicode line separator", "{}\n\u2028", 2, "character U+2028"},
	{"syntax on line 1", "a: b: c\n", 1, "YAML: mapping values are not allowed in this context"},
	{"syntax on a later line", "quotas:\n  a: 1\n\n  b: c: d\n", 4, "YAML: mapping values are not allowed"},
	{"parser error counted from 1", "quotas:\n  a: 1\n}\n", 3, "YAML: did not find expected key"},
	{"unclosed list", "pools:\n  p:\n    gpus: [0, 1\n  q: {}\n", 3, "YAML: did not find expected ',' or ']'"},
	{"unclosed quote", "quotas:\n  'alice: 1\n", 2, "YAML: found unexpected end of stream"},
	{"tab indentation", "quotas:\n\talice: 1\n", 2, "a tab in the indentation: YAML indents with spaces only"},
	{"tab after spaces", "pools:\n  training:\n  \tgpus: [\"1\"]\n", 3, "a tab in the indentation: YAML indents with spaces only"},
	{"tab on a line of its own", "quotas:\n  alice: 2\n\t\n", 3, "a tab in the indentation: YAML indents with spaces only"},
	{"trailing junk", "[a, b]]\n", 1, "YAML: did not find expected <document start>"},
	{"second document", "quotas: {a: 1}\n---\nquotas: {b: 2}\n", 2, "a second YAML document (after ---): a config file holds one"},
	{"empty second document", "quotas: {a: 1}\n---\n", 2, "a second YAML document"},
	{"unknown anchor", "quotas:\n  a: 1\n  b: *one\n", 3, "YAML: unknown anchor 'one' referenced"},
	{"alias", "quotas:\n  a: &n 1\n  b: *n\n", 3, "quotas.b: an alias (*n): aliases are not supported"},
	{"alias of a section", "pools: &p {}\nquotas: *p\n", 2, "quotas: an alias (*p)"},
	{"alias in a list", "pools:\n  p:\n    gpus: [&g 0, *g]\n", 3, "pools.p.gpus[1]: an alias (*g)"},
	{"merge key", "pools:\n  p:\n    <<: {gpus: [0]}\n", 3, "pools.p: a merge key (<<): merge keys are not supported"},
	{"key that is a list", "? [a]\n: 1\n", 1, "expected a key, found a list"},
	{"key with a binary tag", "quotas:\n  !!binary YWxpY2U=: 1\n", 2, `quotas: expected a key, found "YWxpY2U=" tagged !!binary`},

	// Top level.
	{"not a mapping", "- pools\n", 1, "expected a mapping with pools, quotas, profiles or score, found a list"},
	{"a bare word", "pools\n", 1, `found the text "pools"`},
	{"unknown reservations key", "reservations:\n  max: 1\n", 2, `unknown key "max" (reservations has max_user_priority)`},
	{"priority too high", "reservations:\n  max_user_priority: 1001\n", 2, "reservations.max_user_priority: 1001 is not a whole number from -1000 to 1000"},
	{"priority not whole", "reservations: {max_user_priority: 1.5}\n", 1, "reservations.max_user_priority: expected a whole number from -1000 to 1000"},
	{"priority as text", "reservations: {max_user_priority: \"5\"}\n", 1, "reservations.max_user_priority: expected a whole number"},
	{"unknown key", "pool: {}\n", 1, `unknown key "pool" (a config file has pools, quotas, profiles, score and reservations)`},
	{"duplicate section", "quotas: {a: 1}\npools: {}\nquotas: {b: 1}\n", 3, `key "quotas" given twice (first on line 1)`},

	// Pools.
	{"pools not a mapping", "pools: [a]\n", 1, "pools: expected a mapping of pool names to pools, found a list"},
	{"pool name with a space", "pools:\n  my pool: {gpus: [0]}\n", 2, `pools: pool name "my pool": may hold only letters, digits and . _ -`},
	{"pool name with a slash", "pools:\n  a/b: {gpus: [0]}\n", 2, `pool name "a/b"`},
	{"pool name starting with a dot", "pools:\n  .hidden: {gpus: [0]}\n", 2, "must start with a letter or a digit"},
	{"pool name starting with -", "pools:\n  -x: {gpus: [0]}\n", 2, "must start with a letter or a digit"},
	{"empty pool name", "pools:\n  '': {gpus: [0]}\n", 2, `pools: pool name "": empty`},
	{"null pool name", "pools:\n  ~: {gpus: [0]}\n", 2, "pools: expected a key, found nothing"},
	{"long pool name", "pools:\n  " + strings.Repeat("p", MaxPoolName+1) + ": {gpus: [0]}\n", 2, "longer than 64 bytes"},
	{"duplicate pool", poolHead + "  p: {gpus: [1]}\n", 4, `pools: key "p" given twice (first on line 2)`},
	{"too many pools", "pools:\n" + manyPools(MaxPools+1), MaxPools + 2, "pools: more than 256 pools"},
	{"pool left empty", "pools:\n  p:\n", 2, "pools.p: empty: a pool needs gpus"},
	{"pool not a mapping", "pools:\n  p: [0]\n", 2, "pools.p: expected a pool (gpus, users), found a list"},
	{"pool without gpus", "pools:\n  p:\n    users: [alice]\n", 2, "pools.p: no gpus: a pool needs at least one GPU"},
	{"unknown pool key", poolHead + "    gpu: [1]\n", 4, `pools.p: unknown key "gpu" (a pool has gpus and users)`},
	{"gpus empty list", "pools:\n  p:\n    gpus: []\n", 3, "pools.p.gpus: empty: a pool needs at least one GPU"},
	{"gpus left empty", "pools:\n  p:\n    gpus:\n", 3, "pools.p.gpus: empty"},
	{"gpus not a list", "pools:\n  p:\n    gpus: 0\n", 3, `pools.p.gpus: expected a list of GPU indices or UUIDs, found the number "0"`},
	{"gpu neither index nor UUID", "pools:\n  p:\n    gpus:\n      - 0\n      - first\n", 5, `pools.p.gpus[1]: "first" is neither a GPU index (0, 1, ...) nor a GPU UUID (GPU-...)`},
	{"negative gpu index", "pools:\n  p:\n    gpus: [-1]\n", 3, `"-1" is neither a GPU index`},
	{"gpu index out of range", "pools:\n  p:\n    gpus: [1024]\n", 3, "pools.p.gpus[0]: GPU index 1024 is out of range (0 to 1023)"},
	{"huge gpu index", "pools:\n  p:\n    gpus: [99999999999999999999999]\n", 3, "is out of range"},
	{"gpu prefix alone", "pools:\n  p:\n    gpus: [GPU-]\n", 3, `"GPU-" is neither a GPU index`},
	{"uuid with a space", "pools:\n  p:\n    gpus: ['GPU-ab cd']\n", 3, `"GPU-ab cd" is not a GPU UUID`},
	{"uuid too long", "pools:\n  p:\n    gpus: [GPU-" + strings.Repeat("a", 92) + "]\n", 3, "is not a GPU UUID: GPU- and then at most 91"},
	{"gpu a mapping", "pools:\n  p:\n    gpus: [{a: 1}]\n", 3, "pools.p.gpus[0]: expected GPU indices or UUIDs, found a mapping"},
	{"gpu listed twice", "pools:\n  p:\n    gpus: [0, 1, 0]\n", 3, `pools.p.gpus[2]: GPU "0" listed twice (first on line 3)`},
	{"uuid listed twice in two cases", "pools:\n  p:\n    gpus:\n    - GPU-ab\n    - gpu-AB\n", 5, `GPU "gpu-AB" listed twice (first on line 4)`},
	{"too many gpus", "pools:\n  p:\n    gpus: [" + seq(MaxPoolGPUs+1, "") + "]\n", 3, "pools.p.gpus: more than 1024 GPUs"},
	{"users left empty", poolHead + "    users:\n", 4, "pools.p.users: empty: leave users out to open the pool to everyone, or write users: [] for admins only"},
	{"users not a list", poolHead + "    users: alice\n", 4, `pools.p.users: expected a list of users and group:NAME, found the text "alice"`},
	{"empty user", poolHead + "    users: ['']\n", 4, "pools.p.users[0]: empty: write a user name, group:NAME or a uid"},
	{"null user", poolHead + "    users: [~]\n", 4, "pools.p.users[0]: expected users and group:NAME, found nothing"},
	{"group without a name", poolHead + "    users: [alice, 'group:']\n", 4, `pools.p.users[1]: "group:" names no group: write group:NAME`},
	{"user with a space", poolHead + "    users: ['al ice']\n", 4, `pools.p.users[0]: user name "al ice" holds a character other than letters, digits and . _ - @ $`},
	{"misspelt group prefix", poolHead + "    users: ['grp:ml']\n", 4, `user name "grp:ml" holds a character other than`},
	{"group with a colon", poolHead + "    users: ['group:a:b']\n", 4, `group name "a:b" holds a character other than`},
	{"user starting with -", poolHead + "    users: [-x]\n", 4, `user name "-x" starts with -`},
	{"long user name", poolHead + "    users: [" + strings.Repeat("u", MaxName+1) + "]\n", 4, "is longer than 256 bytes"},
	{"uid out of range", poolHead + "    users: [4294967295]\n", 4, "pools.p.users[0]: user id 4294967295 is out of range (0 to 4294967294)"},
	{"gid out of range", poolHead + "    users: ['group:99999999999']\n", 4, "group id 99999999999 is out of range"},
	{"star in users", poolHead + "    users: ['*']\n", 4, `pools.p.users[0]: "*" is for quotas: leave users out to open the pool to everyone`},
	{"user listed twice", poolHead + "    users: [alice, bob, alice]\n", 4, `pools.p.users[2]: "alice" listed twice (first on line 4)`},
	{"too many users", poolHead + "    users: [" + seq(MaxPoolUsers+1, "u") + "]\n", 4, "pools.p.users: more than 4096 users"},

	// Quotas.
	{"quotas not a mapping", "quotas: [alice]\n", 1, "quotas: expected a mapping of users, group:NAME or * to units, found a list"},
	{"negative quota", "quotas:\n  alice: -1\n", 2, "quotas.alice: -1 is negative: a quota is 0 or more units"},
	{"fractional quota", "quotas:\n  alice: 1.5\n", 2, "quotas.alice: 1.5 is not a whole number of units"},
	{"float quota", "quotas:\n  alice: 8.0\n", 2, "8.0 is not a whole number of units"},
	{"quota as text", "quotas:\n  alice: '8'\n", 2, `quotas.alice: expected a whole number of units, found the text "8"`},
	{"quota as a word", "quotas:\n  alice: eight\n", 2, `found the text "eight"`},
	{"quota as a boolean", "quotas:\n  alice: true\n", 2, "found the boolean true"},
	{"quota left empty", "quotas:\n  alice:\n", 2, "quotas.alice: expected a whole number of units, found nothing"},
	{"hexadecimal quota", "quotas:\n  alice: 0x10\n", 2, `quotas.alice: "0x10": write the units as a decimal number`},
	{"quota with a plus", "quotas:\n  alice: +4\n", 2, `"+4": write the units as a decimal number`},
	{"a tag making text a number", "quotas:\n  alice: !!int \"-\\n\"\n", 2, `quotas.alice: "-\n" is negative`},
	{"a tag making a long text a number", "quotas:\n  alice: !!int '" + strings.Repeat("9", 100) + "'\n", 2, `quotas.alice: "9999999999`},
	{"quota too large", "quotas:\n  alice: 1000001\n", 2, "quotas.alice: 1000001 units is more than 1000000, the most a quota may be"},
	{"huge quota", "quotas:\n  alice: 99999999999999999999999\n", 2, "is more than 1000000"},
	{"quota of a group", `quotas: {"group:ml": -2}` + "\n", 1, `quotas."group:ml": -2 is negative`},
	{"quota of everyone", `quotas: {"*": x}` + "\n", 1, `quotas."*": expected a whole number`},
	{"quota key malformed", "quotas:\n  'al ice': 1\n", 2, `quotas: user name "al ice" holds a character`},
	{"quota key empty group", "quotas:\n  'group:': 1\n", 2, `quotas: "group:" names no group`},
	{"quota key empty", "quotas:\n  '': 1\n", 2, "quotas: empty: write a user name"},
	{"quota twice", "quotas:\n  alice: 1\n  bob: 2\n  alice: 3\n", 4, `quotas: key "alice" given twice (first on line 2)`},
	{"too many quotas", "quotas:\n" + manyQuotas(MaxQuotas+1), MaxQuotas + 2, "quotas: more than 4096 quotas"},

	// Profiles.
	{"profiles not a mapping", "profiles: [resnet]\n", 1, "profiles: expected a mapping of task names to run times, found a list"},
	{"task left empty", "profiles:\n  resnet:\n", 2, "profiles.resnet: empty: give the task's run time per GPU model"},
	{"task not a mapping", "profiles:\n  resnet: 95s\n", 2, `profiles.resnet: expected a mapping of GPU model names to run times, found the text "95s"`},
	{"task name with a control character", "profiles:\n  \"res\\tnet\": {T4: 1s}\n", 2, `profiles: task name "res\tnet": holds a control character`},
	{"empty task name", "profiles:\n  '': {T4: 1s}\n", 2, `profiles: task name "": empty`},
	{"long task name", "profiles:\n  " + strings.Repeat("t", MaxName+1) + ": {T4: 1s}\n", 2, "longer than 256 bytes"},
	{"empty model name", "profiles:\n  t: {'': 1s}\n", 2, `profiles.t: GPU model name "": empty`},
	{"run time without a unit", "profiles:\n  t:\n    Tesla T4: 410\n", 3, `profiles.t."Tesla T4": "410" has no unit: write a run time such as 95s or 6m50s`},
	{"run time not a duration", "profiles:\n  t:\n    T4: slow\n", 3, `profiles.t.T4: "slow" is not a run time such as 95s or 6m50s`},
	{"run time zero", "profiles:\n  t:\n    T4: 0s\n", 3, `profiles.t.T4: run time "0s": must be more than 0`},
	{"run time negative", "profiles:\n  t:\n    T4: -5s\n", 3, `run time "-5s": must be more than 0`},
	{"run time overflowing", "profiles:\n  t:\n    T4: 99999999h\n", 3, `"99999999h" is not a run time`},
	{"run time left empty", "profiles:\n  t:\n    T4:\n", 3, "profiles.t.T4: expected a run time such as 95s or 6m50s, found nothing"},
	{"model twice", "profiles:\n  t:\n    T4: 1s\n    T4: 2s\n", 4, `profiles.t: key "T4" given twice (first on line 3)`},
	{"too many models", "profiles:\n  t:\n" + manyModels(MaxTaskModels+1), MaxTaskModels + 3, "profiles.t: more than 64 GPU models"},
	{"too many tasks", "profiles:\n" + manyTasks(MaxTasks+1), MaxTasks + 2, "profiles: more than 4096 tasks"},

	// Score.
	{"score not a mapping", "score: 1\n", 1, `score: expected a mapping of weights (cc, bandwidth, clock), found the number "1"`},
	{"unknown weight", "score:\n  speed: 1\n", 2, `score: unknown key "speed" (score has cc, bandwidth and clock)`},
	{"negative weight", "score:\n  cc: -0.5\n", 2, "score.cc: -0.5 is not a weight from 0 to 1000"},
	{"weight too large", "score:\n  clock: 1001\n", 2, "score.clock: 1001 is not a weight from 0 to 1000"},
	{"infinite weight", "score:\n  cc: .inf\n", 2, `".inf" is not a weight`},
	{"NaN weight", "score:\n  cc: .nan\n", 2, `".nan" is not a weight`},
	{"weight as text", "score:\n  bandwidth: 'high'\n", 2, `score.bandwidth: expected a weight from 0 to 1000, found the text "high"`},
	{"all weights zero", "quotas: {}\nscore:\n  cc: 0\n  clock: 0.0\n", 3, "score: every weight is 0: give one above 0, or leave score out to weigh each 1/3"},
	{"score an empty mapping", "score: {}\n", 1, "score: every weight is 0"},
	{"weight twice", "score:\n  cc: 1\n  cc: 2\n", 3, `score: key "cc" given twice (first on line 2)`},
}

func TestParseErrors(t *testing.T) {
	for _, tc := range parseErrorCases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse([]byte(tc.in))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %+v, %v; want an *Error", f, err)
			}
			if e.Line != tc.line || !strings.Contains(e.Msg, tc.want) {
				t.Fatalf("got line %d: %q\nwant line %d: ...%q...", e.Line, e.Msg, tc.line, tc.want)
			}
			if tc.line > 0 && !strings.HasPrefix(err.Error(), "line "+strconv.Itoa(tc.line)+": ") {
				t.Fatalf("%q does not start with its line", err)
			}
		})
	}
}

func manyPools(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("  p" + strconv.Itoa(i) + ": {gpus: [0]}\n")
	}
	return b.String()
}

func manyQuotas(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("  u" + strconv.Itoa(i) + ": 1\n")
	}
	return b.String()
}

func manyModels(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("    m" + strconv.Itoa(i) + ": 1s\n")
	}
	return b.String()
}

func manyTasks(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("  t" + strconv.Itoa(i) + ": {T4: 1s}\n")
	}
	return b.String()
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(good, []byte(designExample), 0o644)
	os.WriteFile(bad, []byte("quotas:\n  alice: -1\n"), 0o644)
	if f, err := Load(good); err != nil || len(f.Pools) != 2 {
		t.Fatalf("Load(good): %+v, %v", f, err)
	}
	for _, tc := range []struct{ path, want string }{
		{bad, bad + ": line 2: quotas.alice: -1 is negative"},
		{filepath.Join(dir, "none.yaml"), filepath.Join(dir, "none.yaml") + ": no such file or directory"},
		{dir, dir + ": is a directory"},
		// A device is refused before it is read (one never ends), and so
		// is a FIFO, whose read would wait for a writer.
		{"/dev/zero", "/dev/zero: not a regular file (a character device)"},
		{fifo, fifo + ": not a regular file (a FIFO)"},
	} {
		_, err := Load(tc.path)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Load(%s): %v; want %q", tc.path, err, tc.want)
		}
	}
	var e *Error
	if _, err := Load(bad); !errors.As(err, &e) || e.Line != 2 {
		t.Fatalf("Load(bad) does not unwrap to its *Error: %v", err)
	}
}
