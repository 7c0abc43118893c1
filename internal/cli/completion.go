package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Shell completion and the "did you mean" of a mistyped command, both made
// from the command table, so that they name what gpulet takes and nothing
// else.

var completionCommand = command{"bash|zsh|fish", "Print a completion script for the shell named: commands, subcommands and flags.\n\n  bash:  source <(gpulet completion bash)        (or save it in /etc/bash_completion.d)\n  zsh:   source <(gpulet completion zsh)\n  fish:  gpulet completion fish | source", 1, 1,
	func(fs *pflag.FlagSet) func(context.Context, *env) error {
		return func(_ context.Context, e *env) error {
			write, ok := completionScripts[e.args[0]]
			if !ok {
				return usageErr(fmt.Sprintf("no completion for shell %q: want bash, zsh or fish", e.args[0]))
			}
			write(e.out)
			return nil
		}
	}}

var completionScripts = map[string]func(io.Writer){"bash": bashCompletion, "zsh": zshCompletion, "fish": fishCompletion}

// The table refers to the completion command, which reads the table.
func init() {
	commands["completion"] = completionCommand
	subcommands["completion"] = []string{"bash", "zsh", "fish"}
}

// commandWords are each command's words to complete after its name: its
// subcommands, then its flags (--socket included), sorted by command.
func commandWords() (names []string, words map[string][]string) {
	words = map[string][]string{}
	for name, cmd := range commands {
		names = append(names, name)
		fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
		fs.String("socket", "", "")
		cmd.setup(fs)
		w := slices.Clone(subcommands[name])
		fs.VisitAll(func(f *pflag.Flag) { w = append(w, "--"+f.Name) })
		words[name] = w
	}
	slices.Sort(names)
	// help takes a command's name, and is one itself.
	words["help"] = slices.Clone(names)
	names = append(names, "help")
	slices.Sort(names)
	return names, words
}

// globalFlags are the flags before a command's name.
var globalFlags = []string{"--socket", "--version", "--help"}

func bashCompletion(w io.Writer) {
	names, words := commandWords()
	fmt.Fprint(w, `# bash completion of gpulet: source <(gpulet completion bash)
_gpulet() {
	local cur=${COMP_WORDS[COMP_CWORD]} cmd="" i
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		--socket) ((i++)) ;;
		-*) ;;
		*) cmd=${COMP_WORDS[i]}; break ;;
		esac
	done
	local words
	case $cmd in
`)
	fmt.Fprintf(w, "\t\"\") words=%q ;;\n", strings.Join(append(slices.Clone(names), globalFlags...), " "))
	for _, name := range names {
		fmt.Fprintf(w, "\t%s) words=%q ;;\n", name, strings.Join(words[name], " "))
	}
	fmt.Fprint(w, `	*) words="" ;;
	esac
	COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _gpulet gpulet
`)
}

// zshCompletion is the bash function under zsh's bashcompinit, which runs
// bash completion functions as they are.
func zshCompletion(w io.Writer) {
	fmt.Fprint(w, "# zsh completion of gpulet: source <(gpulet completion zsh)\nautoload -U +X bashcompinit && bashcompinit\n")
	bashCompletion(w)
}

func fishCompletion(w io.Writer) {
	names, words := commandWords()
	fmt.Fprintf(w, "# fish completion of gpulet: gpulet completion fish | source\ncomplete -c gpulet -f\n")
	fmt.Fprintf(w, "complete -c gpulet -n __fish_use_subcommand -l socket -r -d %s\n", fishQuote("gpuletd's socket"))
	fmt.Fprintf(w, "complete -c gpulet -n __fish_use_subcommand -l version -d %s\n", fishQuote("print gpulet's version and commit"))
	for _, name := range names {
		summary := commandSummary(name)
		fmt.Fprintf(w, "complete -c gpulet -n __fish_use_subcommand -a %s -d %s\n", name, fishQuote(summary))
		var args []string
		for _, word := range words[name] {
			if flag, ok := strings.CutPrefix(word, "--"); ok {
				fmt.Fprintf(w, "complete -c gpulet -n '__fish_seen_subcommand_from %s' -l %s\n", name, flag)
				continue
			}
			args = append(args, word)
		}
		if len(args) > 0 {
			fmt.Fprintf(w, "complete -c gpulet -n '__fish_seen_subcommand_from %s' -a %s\n", name, fishQuote(strings.Join(args, " ")))
		}
	}
	// config check takes a file.
	fmt.Fprintln(w, "complete -c gpulet -n '__fish_seen_subcommand_from check' -F")
}

// commandSummary is the first line of a command's help, without its end.
func commandSummary(name string) string {
	if name == "help" {
		return "the usage of gpulet, or of one command"
	}
	line, _, _ := strings.Cut(commands[name].help, "\n")
	return strings.TrimSuffix(line, ".")
}

// fishQuote quotes s for fish, in which only \ and ' are special inside
// single quotes.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// suggest names the command closest to a mistyped one: within two edits,
// or the one command that begins with it. Empty when none is close.
func suggest(typed string) string {
	best, bestDist := "", 3
	var prefixed []string
	for name := range commands {
		if d := editDistance(typed, name); d < bestDist || d == bestDist && name < best {
			best, bestDist = name, d
		}
		if len(typed) > 0 && strings.HasPrefix(name, typed) {
			prefixed = append(prefixed, name)
		}
	}
	if best == "" && len(prefixed) == 1 {
		return prefixed[0]
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
