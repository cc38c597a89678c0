# SPDX-License-Identifier: MIT
# bash completion for gnmrctl: its commands, each command's options (both
# read from gnmrctl's own --help, so they follow the program), and job
# names from `gnmrctl jobs --csv` where a command takes a JOB (asked of
# the gnmrd the command line names, with a short timeout). A job's name
# is chosen by whoever runs the job (a peer): it is never given to
# compgen -W (which expands $(...) and `...`) or to eval; it is matched
# as a literal prefix and offered only when it holds nothing a shell reads
# (letters, digits, and . _ - : @ + = , /), so that pressing TAB cannot put
# code on the operator's command line.
# Installed by `make install` into share/bash-completion/completions/.
_gnmrctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} prog=${COMP_WORDS[0]} cmd= i
  local -a glob=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in
      --admin|--store|--curve-server-key|--key-file)
        glob+=("${COMP_WORDS[i]}" "${COMP_WORDS[i+1]}"); ((i++)) ;;
      --admin=*|--store=*|--curve-server-key=*|--key-file=*)
        glob+=("${COMP_WORDS[i]}") ;;
      -*) ;;
      *) cmd=${COMP_WORDS[i]}; break ;;
    esac
  done
  case ${COMP_WORDS[COMP_CWORD-1]} in
    --store|--key-file|--curve-server-key|-o|--output|--scores|--schedule)
      COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  if [[ -z $cmd ]]; then
    if [[ $cur == -* ]]; then
      COMPREPLY=($(compgen -W "--admin --store --curve-server-key
        --key-file --version --help" -- "$cur"))
    else
      COMPREPLY=($(compgen -W "$("$prog" --help 2>&1 |
        sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p')" -- "$cur"))
    fi
    return
  fi
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$("$prog" "$cmd" --help 2>&1 |
      sed '/^global options/,$d' | grep -o -- '--[a-z][a-z-]*' |
      sort -u)" -- "$cur"))
    return
  fi
  case $cmd in
    replay|keygen) COMPREPLY=($(compgen -f -- "$cur")) ;;
    status|units|top|history|decisions|set|export|finish|runs|watch|plot)
      if ((COMP_CWORD == i + 1)); then
        local name
        COMPREPLY=()
        while IFS= read -r name; do
          [[ $name == "$cur"* && $name =~ ^[A-Za-z0-9._:@+=,/-]+$ ]] &&
            COMPREPLY+=("$name")
        done < <("$prog" "${glob[@]}" jobs --csv 2>/dev/null |
          sed -n '2,$s/,.*//p')
      fi ;;
  esac
}
complete -F _gnmrctl gnmrctl
