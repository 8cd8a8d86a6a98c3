/*
 * gloo/common/memory.h — for Gloo installations that leave it out.
 *
 * Debian's libgloo-dev (0.0~git20220518.5b14351) installs
 * gloo/transport/tcp/pair.h and context.h, which include this header, but
 * not the header itself. kolo's Gloo backend needs those two (it derives
 * from Gloo's TCP pair: ops/gloo/gloo_ops.cc, "Strangers"), so the build
 * adds this directory with -idirafter: searched after the system's
 * directories, it is used only where Gloo's own copy is missing.
 *
 * It declares the three reference wrappers of Gloo's TCP transport with the
 * layout the library was built with (each holds one std::shared_ptr or
 * std::weak_ptr), which is all kolo's code needs of them: the types appear
 * in the members of Gloo's classes, whose code lives in libgloo. kolo never
 * creates or dereferences one itself.
 */
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class NonOwningPtr;
template <typename T>
class WeakNonOwningPtr;
template <typename T>
class ShareableNonOwningPtr;

/* A short-lived strong reference, taken from a WeakNonOwningPtr while the
 * object is alive. */
template <typename T>
class NonOwningPtr final {
  public:
    NonOwningPtr() = default;
    explicit NonOwningPtr(const WeakNonOwningPtr<T> &weak)
        : ptr_(weak.ptr_.lock())
    {
    }
    T *operator->() const noexcept { return ptr_.get(); }
    explicit operator bool() const noexcept { return ptr_ != nullptr; }

  private:
    std::shared_ptr<T> ptr_;
};

/* A weak reference handed out by a ShareableNonOwningPtr. */
template <typename T>
class WeakNonOwningPtr final {
  public:
    WeakNonOwningPtr() = default;
    explicit WeakNonOwningPtr(const ShareableNonOwningPtr<T> &root)
        : ptr_(root.ptr_)
    {
    }
    /* Whether it was ever set (not whether the object still lives). */
    explicit operator bool() const noexcept
    {
        std::weak_ptr<T> none;
        return ptr_.owner_before(none) || none.owner_before(ptr_);
    }

  protected:
    std::weak_ptr<T> ptr_;
    friend class NonOwningPtr<T>;
};

/* The root reference, held by the object itself. Only declared with its
 * layout here: its destructor (which waits for the strong references to
 * go) is compiled into libgloo, never into kolo. */
template <typename T>
class ShareableNonOwningPtr final {
  public:
    explicit ShareableNonOwningPtr(T *t) : ptr_(t, [](T *) {}) {}
    ShareableNonOwningPtr(const ShareableNonOwningPtr &) = delete;
    ShareableNonOwningPtr &operator=(const ShareableNonOwningPtr &) = delete;
    ~ShareableNonOwningPtr();

  protected:
    std::shared_ptr<T> ptr_;
    friend class WeakNonOwningPtr<T>;
};

} // namespace gloo
