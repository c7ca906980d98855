# Sourced by setup.sh and install.sh. `apt_ensure WHO PKG...` installs the packages this machine
# lacks: nothing (not even `apt-get update`) when it has them all, else one update and one install.
# APT_BEFORE_INSTALL may name a command to run just before the install.
apt_ensure() {
    local who="$1" pkg
    shift
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    echo "$who: installing apt packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    ${APT_BEFORE_INSTALL:-:}
    apt-get install -y -qq "${missing[@]}" >/dev/null
}
