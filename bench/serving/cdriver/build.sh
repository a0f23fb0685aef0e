# Build the prototype C driver in place (needs gcc and Python headers).
set -e
cd "$(dirname "$0")"
INC=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
SUF=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
gcc -O2 -Wall -shared -fPIC -I"$INC" _cdriver.c -o "_cdriver$SUF" -ldl -lpthread
