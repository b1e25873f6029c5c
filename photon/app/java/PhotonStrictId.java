/*
 * The id of a JSON line of one strict shape, read from its bytes without parsing it as JSON
 * (photon/app/_scanner.py compiles this file at first use; docs/verify.md, "The job").
 *
 * call(line, name) gives the line's id (its bytes: plain ASCII, so its UTF-8 as it stands; the caller casts
 * them to a string without another copy, photon/app/_scanner.py's expression) where the line is exactly
 *
 *     {"<name>":"<id>"  then  ,"<member>":<value>  any number of times  then  }  and the line's end
 *
 * with <name>, <id> and every <member> plain (1-byte characters 0x20-0x7E but '"' and '\'), every string
 * value plain but for escapes (\" \\ \/ \b \f \n \r \t, a u escape of four hex digits but a surrogate)
 * and well-formed UTF-8 sequences of 2-4 bytes (no overlong form, no surrogate, nothing above U+10FFFF), every
 * <value> such a
 * string, a number (an integer without a leading zero, at most 18 digits, an
 * optional '-'; then optionally '.' and 1-18 digits; then optionally 'e' or 'E', an optional sign and 1-3
 * digits), true, false, null or one level of an object of such members whose values are such scalars, no
 * whitespace anywhere and no other top-level member named <name>. Such a line is valid JSON whose
 * top-level <name> is the string <id>, which is what Spark's JSON reader gives for it. For every other line
 * (valid JSON or not, blank, torn, with escapes, spaces, arrays, a second
 * <name>, bytes above 0x7E, a string longer than MAX_STRING or a name longer than MAX_NAME bytes) it gives
 * null, and the caller reads that line's whole file with Spark's JSON reader instead: so the result is
 * always the JSON reader's.
 */
package photon;

import java.util.Arrays;

import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.api.java.UDF2;

public final class PhotonStrictId implements UDF2<byte[], byte[], byte[]> {
    private static final long serialVersionUID = 1L;
    static final int MAX_STRING = 1 << 16;
    static final int MAX_NAME = 1 << 10;
    static final int MAX_DIGITS = 18;
    static final int MAX_EXPONENT = 3;
    private static final byte[] TRUE = {'t', 'r', 'u', 'e'};
    private static final byte[] FALSE = {'f', 'a', 'l', 's', 'e'};
    private static final byte[] NULL = {'n', 'u', 'l', 'l'};

    @Override
    public byte[] call(byte[] line, byte[] name) {
        return id(line, name);
    }

    /** The end of the plain string whose first byte (after its opening quote) is at {@code p}: the index
     *  of its closing quote, or -1. */
    private static int plainEnd(byte[] b, int p, int n, int max) {
        int limit = Math.min(n, p + max + 1);
        for (int i = p; i < limit; i++) {
            int c = b[i];
            if (c == '"') {
                return i;
            }
            if (c < 0x20 || c > 0x7E || c == '\\') {       // bytes above 0x7F are negative
                return -1;
            }
        }
        return -1;
    }

    /** The index after the integer starting at {@code p}, or -1. */
    private static int intEnd(byte[] b, int p, int n) {
        if (p < n && b[p] == '-') {
            p++;
        }
        if (p >= n) {
            return -1;
        }
        if (b[p] == '0') {
            return p + 1;
        }
        int start = p;
        while (p < n && b[p] >= '0' && b[p] <= '9') {
            p++;
        }
        return p == start || p - start > MAX_DIGITS ? -1 : p;
    }

    /** The value of the hex digit {@code c}, or -1. */
    private static int hex(int c) {
        if (c >= '0' && c <= '9') {
            return c - '0';
        }
        if (c >= 'a' && c <= 'f') {
            return c - 'a' + 10;
        }
        if (c >= 'A' && c <= 'F') {
            return c - 'A' + 10;
        }
        return -1;
    }

    /** As {@link #plainEnd}, but the string may also hold the escapes \" \\ \/ \b \f \n \r \t and
     *  a u escape of four hex digits (not a surrogate, D800-DFFF): the index of its closing quote, or -1. */
    private static int escapedEnd(byte[] b, int p, int n, int max) {
        int limit = Math.min(n, p + max + 1);
        for (int i = p; i < limit; i++) {
            int c = b[i];
            if (c == '"') {
                return i;
            }
            if (c == '\\') {
                if (i + 1 >= n) {
                    return -1;
                }
                int e = b[i + 1];
                if (e == 'u') {
                    if (i + 5 >= n) {
                        return -1;
                    }
                    int v = 0;
                    for (int j = i + 2; j < i + 6; j++) {
                        int h = hex(b[j]);
                        if (h < 0) {
                            return -1;
                        }
                        v = v * 16 + h;
                    }
                    if (v >= 0xD800 && v <= 0xDFFF) {
                        return -1;
                    }
                    i += 5;
                } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r'
                        || e == 't') {
                    i += 1;
                } else {
                    return -1;
                }
                continue;
            }
            if (c < 0) {
                int len = utf8Length(b, i, n);
                if (len < 0) {
                    return -1;
                }
                i += len - 1;
                continue;
            }
            if (c < 0x20 || c > 0x7E) {
                return -1;
            }
        }
        return -1;
    }

    /** The length of the well-formed UTF-8 sequence of 2-4 bytes at {@code p} (no overlong form, no
     *  surrogate, nothing above U+10FFFF), or -1. */
    private static int utf8Length(byte[] b, int p, int n) {
        int u = b[p] & 0xFF;
        int len;
        int lo = 0x80;
        int hi = 0xBF;
        if (u >= 0xC2 && u <= 0xDF) {
            len = 2;
        } else if (u == 0xE0) {
            len = 3;
            lo = 0xA0;
        } else if (u >= 0xE1 && u <= 0xEC || u == 0xEE || u == 0xEF) {
            len = 3;
        } else if (u == 0xED) {
            len = 3;
            hi = 0x9F;
        } else if (u == 0xF0) {
            len = 4;
            lo = 0x90;
        } else if (u >= 0xF1 && u <= 0xF3) {
            len = 4;
        } else if (u == 0xF4) {
            len = 4;
            hi = 0x8F;
        } else {
            return -1;
        }
        if (p + len > n) {
            return -1;
        }
        int second = b[p + 1] & 0xFF;
        if (second < lo || second > hi) {
            return -1;
        }
        for (int j = p + 2; j < p + len; j++) {
            int c = b[j] & 0xFF;
            if (c < 0x80 || c > 0xBF) {
                return -1;
            }
        }
        return len;
    }

    /** The index after the digits starting at {@code p} (at least one, at most {@code max}), or -1. */
    private static int digitsEnd(byte[] b, int p, int n, int max) {
        int start = p;
        while (p < n && b[p] >= '0' && b[p] <= '9') {
            p++;
        }
        return p == start || p - start > max ? -1 : p;
    }

    /** The index after the JSON number starting at {@code p} (an integer as {@link #intEnd}, then an
     *  optional fraction of 1-18 digits, then an optional exponent of 1-3 digits with an optional sign),
     *  or -1. */
    private static int numberEnd(byte[] b, int p, int n) {
        p = intEnd(b, p, n);
        if (p < 0) {
            return -1;
        }
        if (p < n && b[p] == '.') {
            p = digitsEnd(b, p + 1, n, MAX_DIGITS);
            if (p < 0) {
                return -1;
            }
        }
        if (p < n && (b[p] == 'e' || b[p] == 'E')) {
            p++;
            if (p < n && (b[p] == '+' || b[p] == '-')) {
                p++;
            }
            p = digitsEnd(b, p, n, MAX_EXPONENT);
        }
        return p;
    }

    /** The index after {@code word} at {@code p}, or -1. */
    private static int wordEnd(byte[] b, int p, int n, byte[] word) {
        if (n - p < word.length) {
            return -1;
        }
        for (int i = 0; i < word.length; i++) {
            if (b[p + i] != word[i]) {
                return -1;
            }
        }
        return p + word.length;
    }

    /** The index after the scalar value (plain string, number, true, false or null) starting at {@code p},
     *  or -1. */
    private static int scalarEnd(byte[] b, int p, int n) {
        if (p >= n) {
            return -1;
        }
        switch (b[p]) {
            case '"':
                int end = escapedEnd(b, p + 1, n, MAX_STRING);
                return end < 0 ? -1 : end + 1;
            case 't':
                return wordEnd(b, p, n, TRUE);
            case 'f':
                return wordEnd(b, p, n, FALSE);
            case 'n':
                return wordEnd(b, p, n, NULL);
            default:
                return numberEnd(b, p, n);
        }
    }

    /** The index after the one-level object starting at {@code p} (its '{'), or -1. */
    private static int objectEnd(byte[] b, int p, int n) {
        p++;
        if (p < n && b[p] == '}') {
            return p + 1;
        }
        while (true) {
            if (p >= n || b[p] != '"') {
                return -1;
            }
            int end = plainEnd(b, p + 1, n, MAX_NAME);
            if (end < 0 || end + 1 >= n || b[end + 1] != ':') {
                return -1;
            }
            p = scalarEnd(b, end + 2, n);
            if (p < 0 || p >= n) {
                return -1;
            }
            if (b[p] == '}') {
                return p + 1;
            }
            if (b[p] != ',') {
                return -1;
            }
            p++;
        }
    }

    private static boolean sameName(byte[] b, int start, int end, byte[] name) {
        if (end - start != name.length) {
            return false;
        }
        for (int i = 0; i < name.length; i++) {
            if (b[start + i] != name[i]) {
                return false;
            }
        }
        return true;
    }

    /** See the class comment. */
    public static byte[] id(byte[] b, byte[] name) {
        if (b == null || name == null) {
            return null;
        }
        int n = b.length;
        int k = name.length;
        if (n < k + 7 || b[0] != '{' || b[1] != '"' || b[n - 1] != '}' || b[k + 2] != '"' || b[k + 3] != ':'
                || b[k + 4] != '"' || k > MAX_NAME) {
            return null;
        }
        for (int i = 0; i < k; i++) {
            int c = name[i];
            if (b[2 + i] != c || c < 0x20 || c > 0x7E || c == '"' || c == '\\') {
                return null;
            }
        }
        int idStart = k + 5;
        int idEnd = plainEnd(b, idStart, n, MAX_STRING);
        if (idEnd < 0) {
            return null;
        }
        int p = idEnd + 1;
        while (true) {
            if (p >= n) {
                return null;
            }
            if (b[p] == '}') {
                return p == n - 1 ? Arrays.copyOfRange(b, idStart, idEnd) : null;
            }
            if (b[p] != ',' || p + 1 >= n || b[p + 1] != '"') {
                return null;
            }
            int end = plainEnd(b, p + 2, n, MAX_NAME);
            if (end < 0 || end + 1 >= n || b[end + 1] != ':' || sameName(b, p + 2, end, name)) {
                return null;
            }
            p = end + 2;
            p = p < n && b[p] == '{' ? objectEnd(b, p, n) : scalarEnd(b, p, n);
            if (p < 0) {
                return null;
            }
        }
    }

    /** The id format's byte test (photon/app/_verify.py, _cheaply_well_formed, in one pass over the id's
     *  bytes): true only for {@code <prefix>:<pid>:<time>} with the time 16 ASCII digits, the first not '0',
     *  the pid 1-15 ASCII digits, the first not '0', a prefix of at least one byte not starting with ':', and
     *  no '\n' anywhere; false for every other id (the pattern decides those), null for a null id. */
    public static final class WellFormed implements UDF1<byte[], Boolean> {
        private static final long serialVersionUID = 1L;
        static final int TIME_DIGITS = 16;
        static final int MAX_PID_DIGITS = 15;

        @Override
        public Boolean call(byte[] b) {
            return b == null ? null : test(b);
        }

        /** Whether {@code b[from, to)} is 1 to {@code max} ASCII digits, the first not '0'. */
        private static boolean digits(byte[] b, int from, int to, int max) {
            if (to - from < 1 || to - from > max || b[from] == '0') {
                return false;
            }
            for (int i = from; i < to; i++) {
                if (b[i] < '0' || b[i] > '9') {
                    return false;
                }
            }
            return true;
        }

        public static boolean test(byte[] b) {
            int n = b.length;
            int time = n - TIME_DIGITS - 1;              // where the time's ':' must be
            if (time < 3 || b[time] != ':' || b[0] == ':' || !digits(b, time + 1, n, TIME_DIGITS)) {
                return false;
            }
            int pid = time - 1;
            while (pid >= 0 && b[pid] != ':') {
                pid--;
            }
            if (pid < 1 || !digits(b, pid + 1, time, MAX_PID_DIGITS)) {
                return false;
            }
            for (int i = 0; i < pid; i++) {
                if (b[i] == '\n') {
                    return false;
                }
            }
            return true;
        }
    }
}
