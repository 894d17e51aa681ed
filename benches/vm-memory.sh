# Sourced by the benchmark scripts that write gigabytes into new pages (compare-postgres.sh,
# receivewal-cost.sh, standby-catchup.sh): the VM's free page reporting, held off for a run.
#
# A VM with virtio-balloon free page reporting (/sys/module/page_reporting) hands memory that
# has been free for a while back to its host, and the guest's first write to such a page waits
# for the host to supply it again: on the development VM 4 GiB written into /dev/shm took 1.6-3.4 s
# right after the same amount had been freed and 8.1-9.3 s when it had been free for 15 s, and
# 19 GB of memory that had never been touched took 51 s. A receiver writing what a server sends
# into new files pays that, so which run met such pages decided more than the server did.
# Holding reporting off (an order above the largest the kernel has, 10, so that no free block
# qualifies) and writing the memory once before the measurements removes the difference; the
# order is put back when the script ends.
#
# Set VM_MEMORY_KEEP=1 (compare-postgres.sh: --keep-page-reporting) to leave the machine alone.

VM_REPORTING_KNOB=/sys/module/page_reporting/parameters/page_reporting_order
# The order to put back at exit; empty unless this script changed it.
VM_REPORTING_ORDER=""

# Holds reporting off where the knob is writable; sets VM_MEMORY_STATE, a description for the
# results' header.
vm_memory_hold() {
    VM_MEMORY_STATE="no free page reporting"
    [ -r "$VM_REPORTING_KNOB" ] || return 0
    local order
    order=$(cat "$VM_REPORTING_KNOB")
    VM_MEMORY_STATE="free page reporting of order $order"
    if [ "${VM_MEMORY_KEEP:-0}" = 1 ] || [ ! -w "$VM_REPORTING_KNOB" ] || [ "$order" -gt 10 ]; then
        return 0
    fi
    VM_REPORTING_ORDER=$order
    echo 11 > "$VM_REPORTING_KNOB"
    VM_MEMORY_STATE="$VM_MEMORY_STATE, held off for this run"
}

# When reporting is held off: writes what memory is available, less 3 GiB of room and at most
# 20 GiB, into a file under DIR (a tmpfs) once and removes it, so that no measurement meets
# memory the host has taken back. Prints how much it wrote.
vm_memory_touch() {
    [ -n "$VM_REPORTING_ORDER" ] || return 0
    local mib
    mib=$(awk '/^MemAvailable:/ { m = int($2 / 1024) - 3072; if (m > 20480) m = 20480; print (m > 0 ? m : 0) }' /proc/meminfo)
    echo "touching $mib MiB of memory once (page reporting held off for the run)" >&2
    dd if=/dev/zero of="$1/vm-memory-touch" bs=1M count="$mib" status=none
    rm -f "$1/vm-memory-touch"
}

# Puts the reporting order back; for the scripts' exit traps.
vm_memory_release() {
    if [ -n "$VM_REPORTING_ORDER" ]; then
        echo "$VM_REPORTING_ORDER" > "$VM_REPORTING_KNOB"
        VM_REPORTING_ORDER=""
    fi
}
